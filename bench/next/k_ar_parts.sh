#!/bin/bash
# #6 (nvidia-h200, two calls of ~5 min): where the 27B AR step's 14.38 ms go now that the AR loop is one CUDA graph,
# and whether the opt-in fused kernels pay off inside it. Session 9 timed them before the loop graphs: AR round
# 15.40 ms without, 15.36 with JAXSPEC_GDN_DECODE=pallas_triton, 15.91 with JAXSPEC_ADD_RMS_NORM=pallas_triton
# (bench/results/2026-11-30-h200-kernel-flags/). Each run: `bench.rounds --phases ar --trace-ar` at 1K (the bare step
# and the engine's AR loop, profiled, kernels charged to the model's parts, 40 top kernels).
# Call 1: PART=1 (k_gemv.py with XLA's default and with cuBLAS only; the default and the fused GDN step).
# Call 2: PART=2 (the fused add + RMSNorm; both kernels).
# Predicted (session 36): default loop 14.38 +- 0.1 ms queued; the fused GDN step 0.0-0.5 ms shorter (XLA's one-token
# GDN path was ~1.0 ms in ~670 kernels in session 1's profile, the kernel 6.5 us a layer in the model); the fused add +
# RMSNorm within +-0.2 ms. A flag becomes the default only if the queued loop round drops by >= 0.2 ms.
# JAXSPEC_COMMIT=<hash> PART=1|2 bash bench/next/k_ar_parts.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kap; mkdir -p $W
trap 'cp $W/*.json $W/*.log $OUT/ 2>/dev/null; grep -h "rc=\|TB/s\|ar_round_device_loop {\|ar_step {" $W/*.log' EXIT
run() {  # name, env...
  local name=$1; shift
  env "$@" timeout 200 python -m bench.rounds --config real --context 1024 --phases ar --rounds-only --trace-ar \
    --out $W/$name.json > $W/$name.log 2>&1
  echo "$name rc=$?" >> $W/$name.log
}
if [ "${PART:?}" = 1 ]; then
  timeout 100 python bench/next/k_gemv.py --out $W/gemv-default.json > $W/gemv-default.log 2>&1; echo "gemv rc=$?" >> $W/gemv-default.log
  XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 100 python bench/next/k_gemv.py --out $W/gemv-cublas.json \
    > $W/gemv-cublas.log 2>&1; echo "gemv-cublas rc=$?" >> $W/gemv-cublas.log
  run default JAXSPEC_LOOP_GRAPHS=ar
  run gdn_decode JAXSPEC_LOOP_GRAPHS=ar JAXSPEC_GDN_DECODE=pallas_triton
else
  run add_rms_norm JAXSPEC_LOOP_GRAPHS=ar JAXSPEC_ADD_RMS_NORM=pallas_triton
  run both JAXSPEC_LOOP_GRAPHS=ar JAXSPEC_GDN_DECODE=pallas_triton JAXSPEC_ADD_RMS_NORM=pallas_triton
fi
