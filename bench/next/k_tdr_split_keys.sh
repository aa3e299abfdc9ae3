#!/bin/bash
# #6 (nvidia-h200, one call, ~7 min): the tree delta rule's `split_keys` (session 47, ff80e6f; CPU-tested only).
# In session 46's round profile the apply kernel took 21.5 us a GDN layer at N = 64: the program of the last tile
# runs 4 key chunks in sequence, each with a loop over the 4 tiles j <= i (~24 dependent load+dot steps).
# split_keys forms W = Tb E K and U = E Q - M E K in `_keys_kernel` (a program per tile and key chunk, <= 4 steps),
# so the apply runs <= 8 steps; it adds one launch and a 2 x 1.5 MB round trip a layer.
#   1. The op bench (fixed in session 46: each layer depends on the last), the default against split_keys with key
#      chunks of 32 and 64, N = 16 / 64 / 65. Predicted, us a layer: the default 19.2 / 51.1 / 60.6 as in session
#      46; split_keys 18-22 / 40-46 / 48-55 (N = 16: one tile, the chain barely shorter, one launch more).
#   2. The split_keys GPU tests (real shape, N = 16 chain, 64 and 65 trees), bound 1e-4.
#   3. The rounds at 1K, the tree as it is, then _alt/ (a copy with split_keys on by default), one lease.
#      Predicted: DDTree(63) 0.3-0.5 ms shorter; DFlash within +-0.15 ms.
# If the DDTree(63) round is >= 0.2 ms shorter and DFlash not longer by more than 0.1: make it the default for
# blocks of more than one tile (or all, if N = 16 wins too), run the whole tree delta rule GPU file, remove the flag.
# Else remove `split_keys` and `_keys_kernel`, with the numbers in the docstring.
#   OUT=... bash bench/next/k_tdr_split_keys.sh    (writes $OUT/tdr-split-keys.tgz; CONFIG=tiny JAX_PLATFORMS=cpu
#   dry run: rounds only, the op bench needs the GPU)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
save() { tar czf $OUT/tdr-split-keys.tgz -C $W .; }
trap save EXIT
rm -rf _alt && mkdir _alt && cp -r jaxspec pallas_kernels bench pyproject.toml _alt/
sed -i 's/split_m=False, split_keys=False/split_m=False, split_keys=True/' _alt/pallas_kernels/tree_delta_rule/pallas_triton.py
grep -q "split_keys=True):" _alt/pallas_kernels/tree_delta_rule/pallas_triton.py || { echo "_alt: default not set"; exit 2; }
if [ "$JAX_PLATFORMS" != cpu ]; then
  timeout 120 python -m pallas_kernels.tree_delta_rule.bench --sweep --sizes 16,64,65 \
    --impls pallas_triton,pallas_triton/split_keys,pallas_triton/split_keys/kc64 --json $W/bench.json > $W/bench.log 2>&1
  echo "bench rc=$? at $((SECONDS - START)) s"; grep "N=" $W/bench.log | cut -c1-120; save
  timeout 100 python -m pytest -q -rA -m gpu tests/test_tree_delta_rule_kernel.py -k split_keys -p no:cacheprovider \
    > $W/gpu-tests.log 2>&1
  echo "tests rc=$? at $((SECONDS - START)) s"; tail -2 $W/gpu-tests.log; save
fi
rounds() {  # NAME
  timeout 140 python -m bench.rounds --config $CONFIG --context 1024 --phases ddtree,dflash --rounds-only \
    --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$1.json > $W/rounds-$1.log 2>&1
  echo "rounds $1 rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-$1.log | cut -c1-120
}
rounds default; save
(cd _alt && rounds split_keys)
