#!/bin/bash
# Session 67's H100 fallback (~4 min): the DDTree build's GPU top-k tie order (a review's check script: its trees
# against a heap of the paper's algorithm, with lax.top_k's order on ties) under each JAXSPEC_DDTREE_TOP_K, then the
# engine's GPU tests (lossless with every kernel on) after the recurrence's removal.
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee $OUT/gpu.txt
for m in default sort count; do
  if [ $m = default ]; then env -u JAXSPEC_DDTREE_TOP_K timeout 120 python bench/next/ddtree_gpu_check.py
  else JAXSPEC_DDTREE_TOP_K=$m timeout 120 python bench/next/ddtree_gpu_check.py; fi > $OUT/ddtree-$m.log 2>&1
  echo "ddtree $m rc=$?"; grep -v "^WARNING" $OUT/ddtree-$m.log | tail -6
done
timeout 280 python -m pytest -q -rA -m gpu tests/test_kernels_engine.py -p no:cacheprovider > $OUT/gpu-tests-engine.log 2>&1
echo "engine rc=$?"; tail -5 $OUT/gpu-tests-engine.log
