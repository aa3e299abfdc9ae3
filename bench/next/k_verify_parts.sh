#!/bin/bash
# Ran in session 42 (bench/results/2026-12-04-h200-s42/parts/): a record of what ran. Its --trace-ar loop half is
# meaningless with the loop as a CUDA graph; bench.rounds now says so instead of comparing.
# #6 (nvidia-h200, one call, ~6 min): what a verify adds to the AR step, by part, at the current defaults; and where
# the one-wave Mosaic GPU matmul's gain went inside the model (session 41).
# Session 41 (bench/results/2026-12-04-h200-s41/): the Mosaic kernel beat XLA's dot alone on the narrow products by
# 4-17%, but given them (`auto`) verify(16) took 15.95 ms of kernels against 15.88, and the rounds 0.24-0.40 ms longer.
# From the sweep's XLA rates verify(16)'s products are ~13.2 ms + lm_head, so ~2 ms of it is not products; the only
# verify profile by part is session 9's (13.1 ms gemms, 3.2 other; older code).
#   1. The AR step and the AR loop by part (bench.rounds --trace-ar).
#   2. verify(16) and verify(64) (a DDTree(63) tree with its root) by part (bench.verify_profile).
#   3. verify(16) with JAXSPEC_SKINNY_MATMUL=pallas_mosaic (the kernel wherever it applies, gate|up included):
#      compare its kernels around each product with 2's (the fp32 partials' sum / transpose / cast).
# Predicted: verify(16) - AR step ~2.5-2.7 ms of kernels: gemms +1.2-1.6, GDN (tree delta rule, conv, gates)
# +0.5-0.8, attention +0.1-0.3. In 3, the products' kernels ~0.3-0.5 ms shorter and ~0.3 ms more in small fusions.
#   bash bench/next/k_verify_parts.sh           (writes $OUT/parts.tgz; CONFIG=tiny for a dry run on a CPU)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
timeout 200 python -m bench.rounds --config $CONFIG --context 1024 --phases ar --rounds-only --trace-ar \
  --max-len 8192 --out $W/ar.json > $W/ar.log 2>&1
echo "ar rc=$?"; grep "ar_trace\|ar_step {" $W/ar.log | cut -c1-300
for spec in "16 chain" "64 tree"; do
  set -- $spec
  timeout 90 python -m bench.verify_profile --config $CONFIG --nodes $1 $([ $2 = tree ] && echo --tree) \
    --out $W/default > $W/verify$1.log 2>&1
  echo "verify($1) rc=$?"; grep -m3 "kernel_ms_per_step\|gemm_ms_per_step\|other_kernels" $W/verify$1.log
done
JAXSPEC_SKINNY_MATMUL=pallas_mosaic timeout 90 python -m bench.verify_profile --config $CONFIG --nodes 16 \
  --out $W/mosaic > $W/verify16-mosaic.log 2>&1
echo "verify(16) mosaic rc=$?"; grep -m3 "kernel_ms_per_step\|gemm_ms_per_step\|other_kernels" $W/verify16-mosaic.log
tar czf $OUT/parts.tgz -C $W .
