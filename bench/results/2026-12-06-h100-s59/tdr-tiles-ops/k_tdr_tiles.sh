#!/bin/bash
# Ran in session 59 (PART=ops only) at f49a0ff, where `tile=` existed: refuted (README.md here); the option was
# removed after the call. Kept as the record of what ran.
# Session 59, #6: the tree delta rule with tiles of 32 or 64 rows (`tile=`, opt-in). With 16-row tiles a DDTree(63)
# verify block (64 nodes) is 4 tiles: prepare's program runs ~62 dependent [16, 16] dots and the last tile's apply
# program ~48, each a shared-memory layout round trip; 32-row tiles cut these to ~21 and ~28 larger dots.
# Predicted (bench/NOTES.md, "Session 59"): tile 32 at N = 64 takes the op from ~46 to 32-40 us a layer; N = 16
# unchanged (the tile is clipped to the block); N = 65 (96 rows against 80) within 10% of the default.
#   PART=ops: the op bench at N = 16, 64, 65 (default and the tile variants) and the variants' GPU tests (~3 min)
#   PART=rounds TILE=32: DDTree(63) rounds at 1K, alternating default / tile (`_alt_tile/`) (~6.5 min; DFlash's
#     blocks of 16 are one tile either way)
#   PART=... OUT=... bash bench/next/k_tdr_tiles.sh   (CONFIG=tiny JAX_PLATFORMS=cpu PART=rounds is the dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
PART=${PART:?PART=ops or PART=rounds}
CONFIG=${CONFIG:-real}
W=$OUT/tdr-tiles-$PART; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt 2>/dev/null
START=$SECONDS
SRC=pallas_kernels/tree_delta_rule/pallas_triton.py
case $PART in
  ops)
    IMPLS=pallas_triton,pallas_triton/tile32/w4,pallas_triton/tile32/w8,pallas_triton/tile64/w4
    IMPLS=$IMPLS,pallas_triton/tile64/w8,pallas_triton/tile64/w8/gram_outside
    timeout 200 python -m pallas_kernels.tree_delta_rule.bench --sizes 16,64,65 --sweep --impls $IMPLS \
      --json $W/bench.json > $W/bench.log 2>&1
    echo "op bench rc=$? at $((SECONDS - START)) s"; grep -v "^WARNING" $W/bench.log | grep "N=" | cut -c1-150
    timeout 150 python -m pytest -q -rA -m gpu tests/test_tree_delta_rule_kernel.py -k "variants" \
      -p no:cacheprovider > $W/gpu-tests.log 2>&1
    echo "variant tests rc=$? at $((SECONDS - START)) s"; tail -1 $W/gpu-tests.log;;
  rounds)
    T=${TILE:?TILE=32 or 64}
    rm -rf _alt_tile && mkdir _alt_tile && cp -r jaxspec pallas_kernels bench convert pyproject.toml _alt_tile/
    sed -i "s/gram_precision=\"tf32x3\", tile=TILE):/gram_precision=\"tf32x3\", tile=$T):/" _alt_tile/$SRC
    grep -q "tile=$T):" _alt_tile/$SRC || { echo "_alt_tile: default not set"; exit 2; }
    i=0
    for v in default tile default tile; do
      i=$((i + 1)); d=.; [ $v = tile ] && d=_alt_tile
      (cd $d && timeout 140 python -m bench.rounds --config $CONFIG --context 1024 --phases ddtree --rounds-only \
        --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$i-$v.json > $W/rounds-$i-$v.log 2>&1)
      echo "rounds $i $v rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-$i-$v.log | cut -c1-100
    done;;
  *) echo "PART=ops or PART=rounds"; exit 2;;
esac
