#!/bin/bash
# Session 17, #6 (nvidia-h200, one call, <= 200 s): the verify kernel's new default splits, then its GPU tests and
# the engine's GPU lossless test. Session 17's sweep at 8703a58 (bench/results/2026-12-01-h200-s17-verify) had 32
# splits fastest at 16, 64 and 65 rows; default_splits now gives 31 at V = 248320 (4 tiles a program).
# Prediction (device time, T = 0 / 0.8): 16 rows 9.9 -> 8.5-9.5 / 21.8 -> 20-22 us; 64 rows 35.6 -> 22-25 /
# 89.2 -> 57-62 us; 65 rows as 64. Every GPU verify test and the engine test pass.
# JAXSPEC_COMMIT=<hash> bash bench/next/k_splits.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/ks; mkdir -p $W
trap '(cd $W && tar czf $OUT/ks.tgz .); grep -h "rc=\|pallas_triton\|passed\|failed" $W/*.log | tail -30' EXIT
T0=$(date +%s); at() { echo $(( $(date +%s) - T0 )); }
timeout 60 python -m pallas_kernels.verify.bench --rows 16,64,65 --impls pallas_triton --splits 4,32 \
  --json $W/verify_default.json > $W/verify_default.log 2>&1
echo "verify bench rc=$? at $(at)" >> $W/verify_default.log
timeout 70 python -m pytest -q -m gpu tests/test_verify_kernel.py > $W/gpu_verify_tests.log 2>&1
echo "verify tests rc=$? at $(at)" >> $W/gpu_verify_tests.log
timeout $(( 200 - $(at) )) python -m pytest -q -m gpu tests/test_kernels_engine.py > $W/gpu_engine_test.log 2>&1
echo "engine test rc=$? at $(at)" >> $W/gpu_engine_test.log
