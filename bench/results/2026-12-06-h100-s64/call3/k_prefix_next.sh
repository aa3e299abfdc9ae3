#!/bin/bash
# Session 64's third call (either card, ~7 min): the prefill piece's prefix tiles (chain_attention.PREFIX_TILES,
# 128 x 64 on 8 warps since this call's tree; before it the tree kernel's 64 x 32 on 4 warps).
#   1. bench/next/k_prefix_tiles.py: the 128 x 64 tile per split count at prefixes of 512-8000 keys;
#   2. the chain op's GPU tests with the new tiles;
#   3. Engine.prefill of 8K tokens in pieces of 256 in the tree before the change (_alt/, made by
#      `mkdir _alt && git archive HEAD~ jaxspec pallas_kernels bench | tar x -C _alt`, carried) and in this one.
#   OUT=... bash bench/next/k_prefix_next.sh    (-> $OUT/k_prefix_next.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
trap 'tar czf $OUT/k_prefix_next.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt 2>/dev/null
timeout 150 python bench/next/k_prefix_tiles.py $W/prefix_tiles.json > $W/prefix_tiles.log 2>&1
echo "tiles rc=$?"; grep -v "^WARNING" $W/prefix_tiles.log | cut -c1-150
timeout 150 python -m pytest -q -rA -m gpu tests/test_chain_attention.py -p no:cacheprovider > $W/gpu-tests.log 2>&1
echo "tests rc=$?"; tail -1 $W/gpu-tests.log
for tree in _alt .; do
  name=$([ $tree = . ] && echo new || echo old)
  (cd $tree && PYTHONPATH=. timeout 170 python -m bench.harness --config real --prompt 8192 --contexts '' \
    --prefill-chunks 256 --out $W/pieces-$name.json > $W/pieces-$name.log 2>&1)
  echo "pieces $name rc=$?"; grep -E "prefill" $W/pieces-$name.log | grep -v "^WARNING" | cut -c1-200 | tail -3
done
