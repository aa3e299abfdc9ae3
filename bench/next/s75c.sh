#!/bin/bash
# Session 75's third call (either card, ~4 min): pallas_kernels/gdn_commit's first GPU run: its GPU tests (the
# compiled kernel against the reference at the real shape, paths of 1 / 16 / 64), then its bench at paths of 16 and
# 1 (XLA's update against the kernel's tilings). Predictions: bench/NOTES.md "## Session 75".
#   OUT=... bash bench/next/s75c.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
START=$SECONDS
timeout 150 python -m pytest -q -rA -m gpu tests/test_gdn_commit_kernel.py -p no:cacheprovider > $OUT/gpu-tests.log 2>&1
echo "gpu tests rc=$? at $((SECONDS - START)) s"; grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/gpu-tests.log | tail -6
timeout $((270 - (SECONDS - START))) python -m pallas_kernels.gdn_commit.bench --paths 16,1 --json $OUT/bench.json \
  > $OUT/bench.log 2>&1
echo "bench rc=$? at $((SECONDS - START)) s"; grep "P=" $OUT/bench.log
