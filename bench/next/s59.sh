#!/bin/bash
# The next session's first call (written in session 58; bench/NOTES.md "Plan for the next GPU session"), branching
# on the card it gets. Both branches first run the engine's GPU tests (the prefill now commits inside the delta
# rule, 75ab8b4: lossless with every kernel on, ~3 min).
#   H200: then #6's table (bench/next/table.sh, its 8K prefill the first since that change), in a second call:
#         this one stops after the tests.
#   H100: then the 8K prefill alone (peak predicted 70-75 GB: it may fit now; out of memory in session 57)
#         and the remat check (bench/next/s58_remat.sh with SLOP=120).
#   OUT=... bash bench/next/s59.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
GPU=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)
echo "gpu: $GPU" | tee $OUT/gpu.txt
OUT=$OUT timeout 300 bash bench/next/gpu_tests.sh engine > /dev/null 2>&1
echo "engine GPU tests: $(tail -1 $OUT/gpu-tests-engine.log)"
case "$GPU" in
  *H200*) echo "H200: run OUT=\$OUT bash bench/next/table.sh next";;
  *)
    timeout 200 python -m bench.harness --config real --contexts '' --prompt 8192 --out $OUT/prefill-8k.json \
      > $OUT/prefill-8k.log 2>&1
    echo "8K prefill rc=$?"; grep -v "^WARNING: Location" $OUT/prefill-8k.log | grep -i "prefill\|error" | tail -4
    SLOP=120 timeout 150 bash bench/next/s58_remat.sh;;
esac
