#!/bin/bash
# Ran in session 41 (bench/results/2026-12-04-h200-s41/auto/): `auto` lost and was removed afterwards, so this
# script is the record of what ran, not one to run again.
# #6 (nvidia-h200, one call, ~9.5 min): the one-wave Mosaic GPU skinny matmul as the GPU default (session 41).
# Session 41's sweep (bench/results/2026-12-04-h200-s41/wave): with one wave of one block per SM the kernel beat
# XLA's dot on the narrow products (down_proj 3.65 -> 3.81 TB/s, out_proj 2.74 -> 3.06 at 16 rows; 3.13 -> 3.47 and
# 2.35 -> 2.74 at 64) and tied it on the MLP's gate|up. JAXSPEC_SKINNY_MATMUL=auto gives it the narrow products.
# 1. The DFlash / DDTree(63) round loops at 1K with =reference (XLA's dot everywhere) and =auto, one lease.
#    Predicted: DFlash -0.2 to -0.35 ms, DDTree(63) -0.5 to -0.8 ms a round.
# 2. The engine's GPU tests (lossless against AR with every kernel on, the loop graphs) at the new default, then
#    the Mosaic GPU kernel's own GPU tests, in what time is left.
#   bash bench/next/k_skinny_auto.sh        (writes $OUT/skinny.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
OUT=${OUT:?}
W=/tmp/ks; mkdir -p $W
git log -1 --format='%h %s' > $W/commit.txt
START=$SECONDS
for S in reference auto; do
  JAXSPEC_SKINNY_MATMUL=$S timeout 150 python -m bench.rounds --config real --context 1024 --phases dflash,ddtree \
    --rounds-only --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$S.json > $W/rounds-$S.log 2>&1
  echo "$S rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-$S.log | cut -c1-200
done
timeout $((560 - (SECONDS - START) - 20)) python -m pytest -q -rA -m gpu tests/test_kernels_engine.py tests/test_engine.py \
  tests/test_skinny_matmul_mosaic.py -p no:cacheprovider > $W/gpu-tests.log 2>&1
echo "tests rc=$? at $((SECONDS - START)) s"; tail -4 $W/gpu-tests.log
tar czf $OUT/skinny.tgz -C $W .
