#!/bin/bash
# Session 67's lease, one script that branches on the card (bench/NOTES.md "## Session 67" has the predictions):
#   CALL=1 OUT=... bash bench/next/s67.sh   either card (~5 min): the recurrence's op part (k_recurrent.sh PART=ops)
#                                           and the engine's GPU test of a prefill piece past the cache's end
#   CALL=2 ...                              H200 only (~9.5 min): #6's table (table.sh)
#   CALL=3 ...                              either card (~5 min): the DFlash round with / without / with the recurrence
#   CALL=4 ...                              H200 only (~4 min): Engine.prefill of 8K in pieces of 1024 and 2048
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU" | tee $OUT/gpu.txt
h200() { case "$GPU" in *H200*) return 0;; *) echo "not an H200: call $CALL skipped"; return 1;; esac; }
case "${CALL:?set CALL=1..4}" in
  1) PART=ops bash bench/next/k_recurrent.sh
     timeout 200 python -m pytest -q -rA -m gpu tests/test_kernels_engine.py -p no:cacheprovider \
       -k prefill_past_the_cache_end > $OUT/gpu-tests-past-cache.log 2>&1
     echo "past-cache rc=$?"; tail -2 $OUT/gpu-tests-past-cache.log;;
  2) h200 && bash bench/next/table.sh;;
  3) PART=rounds bash bench/next/k_recurrent.sh;;
  4) h200 && { timeout 400 python -m bench.harness --config real --contexts '' --prompt 8192 \
       --prefill-chunks 1024,2048 --out $OUT/p8k.json > $OUT/p8k.log 2>&1; echo "p8k rc=$?"; tail -12 $OUT/p8k.log; };;
  *) echo "CALL=1..4"; exit 2;;
esac
