#!/bin/bash
# Session 67's lease, one script that branches on the card (bench/NOTES.md "## Session 67" has the predictions):
#   CALL=2 OUT=... bash bench/next/s67.sh   H200 only (~9.5 min): #6's table (table.sh)
#   CALL=4 ...                              H200 only (~4 min): Engine.prefill of 8K in pieces of 1024 and 2048
#   CALL=5 ...                              either card (~6.5 min): the per-kernel GPU tests (53; > 360 s in s73)
#   CALL=1k ...                             H200 only (~6.5-9 min, a guess): the 1K-only table, for a short budget
#   CALL="4 5" runs both, in that order.
# Calls 1 and 3 (the recurrence) ran or were dropped in session 67: bench/results/2026-12-06-h100-s67/s67.sh.
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU" | tee $OUT/gpu.txt
h200() { case "$GPU" in *H200*) return 0;; *) echo "not an H200: call $C skipped"; return 1;; esac; }
for C in ${CALL:?set CALL=2, 1k, 4 or 5}; do
case "$C" in
  2) h200 && bash bench/next/table.sh;;
  1k) h200 && { W=$(mktemp -d); timeout 560 python -m bench.table --config real --contexts 1024 --budget 63 \
       --deadline-s 540 --out $W > $W/call.log 2>&1; echo "table rc=$?"; tar czf $OUT/table.tgz -C $W .
       grep -E "\| 1024 \||GDN" $W/table.md; };;
  4) h200 && { timeout 400 python -m bench.harness --config real --contexts '' --prompt 8192 \
       --prefill-chunks 1024,2048 --out $OUT/p8k.json > $OUT/p8k.log 2>&1; echo "p8k rc=$?"; tail -12 $OUT/p8k.log; };;
  5) timeout 480 python -m pytest -q -rA -m gpu tests/test_tree_attention_kernel.py tests/test_add_rms_norm_kernel.py \
       tests/test_chain_attention.py tests/test_tree_delta_rule_kernel.py > $OUT/kernels.log 2>&1
     echo "kernel tests rc=$?"; tail -15 $OUT/kernels.log;;
  *) echo "CALL=2, 1k, 4 or 5"; exit 2;;
esac
done
