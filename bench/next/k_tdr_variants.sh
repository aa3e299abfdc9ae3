#!/bin/bash
# #6 (nvidia-h200, one call, ~4 min): after k_tdr_apply.sh (session 46's call 3: the change made the DDTree(63) round
# 2.0 ms longer; the fixed op bench: 19.7 / 107.6 / 595.6 us a layer at N = 16 / 64 / 65 against the tree before's
# 21.8 / 62.3 / 73.0), which half did it. The working tree is v1: the doubling tile inverse with the tree before's
# apply kernel; _v2/ (made by the caller) is the whole change with apply's key chunks back in a fori_loop.
# Predicted: v1 at or below the tree before at every N (the inverse: ~2 us a layer at N = 16, more at 64); v2 between.
#   OUT=... bash bench/next/k_tdr_variants.sh      (writes $OUT/tdr-variants.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
START=$SECONDS
trap 'tar czf $OUT/tdr-variants.tgz -C $W .' EXIT
bench() {  # NAME: the op bench from the current directory
  timeout 70 python -m pallas_kernels.tree_delta_rule.bench --sizes 16,64,65 --impls pallas_triton \
    --json $W/bench-$1.json > $W/bench-$1.log 2>&1
  echo "bench $1 rc=$? at $((SECONDS - START)) s"; grep "N=" $W/bench-$1.log | cut -c1-110
}
bench v1
(cd _v2 && bench v2)
timeout 130 python -m bench.rounds --config real --context 1024 --phases dflash,ddtree --rounds-only \
  --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-v1.json > $W/rounds-v1.log 2>&1
echo "rounds v1 rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-v1.log | cut -c1-120
