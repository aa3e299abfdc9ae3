#!/bin/bash
# Session 65's device calls: whatever card comes. On an H200, #6's table (bench/next/table.sh, owed since session
# 60: session 64's four asks got H100s). On an H100 (which ran the table in session 64): the engine's GPU tests at
# HEAD (session 64 made the prefill donate the drafter's cache, CPU-tested only; its run was cut at 330 s).
#   OUT=... bash bench/next/s65.sh [table|tests]   (no argument: by card; -> $OUT/table.tgz or $OUT/gpu-tests-engine.log)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "card: $GPU" | tee $OUT/gpu.txt
WHAT=$1
if [ -z "$WHAT" ]; then case "$GPU" in *H200*) WHAT=table;; *) WHAT=tests;; esac; fi
case "$WHAT" in
  table) exec bash bench/next/table.sh;;
  tests) exec bash bench/next/gpu_tests.sh engine;;
  *) echo "usage: OUT=... bash bench/next/s65.sh [table|tests]"; exit 2;;
esac
