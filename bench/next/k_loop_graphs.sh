#!/bin/bash
# A GPU session with ~5 minutes to spare, #6: WHILE / CONDITIONAL command buffers for the AR loop alone
# (JAXSPEC_LOOP_GRAPHS=ar, `compiler_options` on the engine's loop jit) against none, in one lease. Session 23 set
# the same option for the whole process through XLA_FLAGS: AR loop 14.90 -> 14.28 ms a round (calls queued), but
# DFlash and DDTree(64) 1.4 / 1.1 ms longer (bench/results/2026-12-02-h200-s23-peel-graphs-eval/).
# Predicted: the AR loop 0.5-0.8 ms shorter with `ar`; the bare AR step (not a loop) unchanged within 0.1 ms.
# If it holds, make `ar` the default of JAXSPEC_LOOP_GRAPHS (jaxspec/engine.py `loop_compiler_options`).
# Session 31 (bench/results/2026-12-03-h200-s31/loop-graphs/): AR loop 15.51 -> 14.95 ms (queued 15.34 -> 14.38), the
# bare step 14.58 -> 14.45: held; `ar` is the default since. The script sets both modes explicitly.
# JAXSPEC_COMMIT=<hash> bash bench/next/k_loop_graphs.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/klg; mkdir -p $W
trap '(cd $W && tar czf $OUT/klg.tgz .); grep -h "rc=\|ar_round_device_loop {\|ar_step {" $W/*.log' EXIT
for mode in none ar; do
  JAXSPEC_LOOP_GRAPHS=$mode timeout 240 python -m bench.rounds --config real --context 1024 --phases ar \
    --rounds-only --out $W/$mode.json > $W/$mode.log 2>&1
  echo "$mode rc=$?" >> $W/$mode.log
done
