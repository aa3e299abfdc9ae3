#!/bin/bash
# #6 (nvidia-h200, one call, <= 9.5 min): the target with its fused projections (jaxspec/model.py `FUSED`: MLP
# gate|up, attention q|k|v, GDN qkv|z|b|a, one product each per layer) against session 36's separate ones.
#   1. the engine's lossless GPU test with every kernel on (tests/test_kernels_engine.py -m gpu);
#   2. the AR step and loop at 1K with its kernel trace (as bench/next/k_ar_parts.sh's `default`);
#   3. issue #6's table at 1K (bench.table, budget 63, the 8K prefill).
# Session 36 (code 9046d20, separate kernels): AR loop 14.29 ms queued, bare step 14.41 (14.54 ms of kernels: k+v as a
# reduction 0.19 ms, GDN b/a 45 reductions 0.13 ms); k_gemv.py: side by side 4% / 10% / 23% less time a layer for the
# MLP / GDN / attention products. Session 16's table (6c99932): verify(16) 1.155x and verify(64) 1.447x the AR step,
# DFlash round 18.68 ms, DDTree(63) 23.84 ms.
# Predicted: AR loop 13.75-13.95 ms queued (-0.35 to -0.55: no k+v or b/a reductions, the MLP's one product ~2%
# faster than two); the verify and round rows ~0.3-0.6 ms shorter each; the ratios to the AR step about as before.
# JAXSPEC_COMMIT=<hash> bash bench/next/k_fused.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kf; mkdir -p $W
T0=$(date +%s); at() { echo $(( $(date +%s) - T0 )); }
trap 'cp -r $W/* $OUT/ 2>/dev/null; grep -h "rc=\|passed\|failed\|ar_round_device_loop {\|ar_step {" $W/*.log; cat $W/t/table.md 2>/dev/null' EXIT
timeout 120 python -m pytest -q -m gpu tests/test_kernels_engine.py -p no:cacheprovider > $W/gpu-tests.log 2>&1
echo "gpu tests rc=$? at $(at)" >> $W/gpu-tests.log
JAXSPEC_LOOP_GRAPHS=ar timeout 200 python -m bench.rounds --config real --context 1024 --phases ar --rounds-only \
  --trace-ar --out $W/ar.json > $W/ar.log 2>&1
echo "ar rc=$? at $(at)" >> $W/ar.log
LEFT=$(( ${LIMIT:-570} - $(at) ))
timeout $LEFT python -m bench.table --config real --contexts 1024 --budget 63 --deadline-s $(( LEFT - 20 )) \
  --out $W/t > $W/table.log 2>&1
echo "table rc=$? at $(at)" >> $W/table.log
