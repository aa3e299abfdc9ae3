#!/bin/bash
# Session 65's device calls: whatever card comes. On an H200, #6's table (bench/next/table.sh, owed since session
# 60: session 64's four asks got H100s). On an H100 (which ran the table in session 64): the engine's GPU tests at
# HEAD (session 64 made the prefill donate the drafter's cache, CPU-tested only; its run was cut at 330 s).
# `ab`: the 8K prefill (one piece, and pieces of 256) in the tree before 5cd45aa (the GDN inputs' reference joins
# the conv history in bf16) and in this one, twice each, alternating (_alt/ made with `git archive e4910bf jaxspec
# pallas_kernels bench ':!bench/results' ':!jaxspec/demo'` and carried).
#   OUT=... bash bench/next/s65.sh [table|tests|ab]   (no argument: by card; -> $OUT/table.tgz,
#                                                      $OUT/gpu-tests-engine.log, or $OUT/ab-*.{json,log})
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "card: $GPU" | tee $OUT/gpu.txt
WHAT=$1
if [ -z "$WHAT" ]; then case "$GPU" in *H200*) WHAT=table;; *) WHAT=tests;; esac; fi
case "$WHAT" in
  table) exec bash bench/next/table.sh;;
  tests) exec bash bench/next/gpu_tests.sh engine;;
  ab) for run in old-1 new-1 old-2 new-2; do
        tree=$([ ${run%-*} = old ] && echo _alt || echo .)
        chunks=$([ ${run#*-} = 1 ] && echo "--prefill-chunks 256")
        (cd $tree && PYTHONPATH=. timeout 160 python -m bench.harness --config real --contexts '' --prompt 8192 \
          --prefill-iters 5 --ceiling-iters 3 $chunks --out $OUT/ab-$run.json > $OUT/ab-$run.log 2>&1)
        echo "$run rc=$?"; grep -E "^\[ *[0-9.]+s\] (engine )?prefill P=8192.*ms" $OUT/ab-$run.log | cut -c1-150
      done;;
  *) echo "usage: OUT=... bash bench/next/s65.sh [table|tests|ab]"; exit 2;;
esac
