#!/bin/bash
# Session 76 (either card, one call, ~9 min): pallas_kernels/conv_commit's GPU tests and bench, then the rounds at
# 1K (DFlash, DDTree(63)) with both commits' references, with gdn_commit, and with both kernels.
#   OUT=... bash bench/next/s76.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
timeout 120 python -m pytest -q -m gpu tests/test_conv_commit_kernel.py 2>&1 | tail -4 | tee $OUT/conv_commit_gpu_tests.txt
timeout 120 python -m pallas_kernels.conv_commit.bench --json $OUT/conv_commit_bench.json 2>&1 | tail -7 \
  | tee $OUT/conv_commit_bench.txt
bash bench/next/k_rounds_ab.sh "JAXSPEC_GDN_COMMIT=reference JAXSPEC_CONV_COMMIT=reference" \
  "JAXSPEC_GDN_COMMIT=pallas_triton" "JAXSPEC_GDN_COMMIT=pallas_triton JAXSPEC_CONV_COMMIT=pallas_triton" \
  2>&1 | tee $OUT/rounds_ab.txt
