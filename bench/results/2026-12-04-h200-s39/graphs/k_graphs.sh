#!/bin/bash
# #6 (nvidia-h200, one call, ~2 min): why does the fused GDN one-token kernel (JAXSPEC_GDN_DECODE=pallas_triton) stop
# XLA from running the engine's AR loop as one command buffer (CUDA graph)?
# Session 38 (bench/results/2026-12-04-h200-s38/3e1ea97-traces/): with that kernel the bare AR step is 13.48 ms against
# 13.67, but the loop is 13.65 against 13.58. The profiler then sees every loop kernel (1073 a step, 0.32 ms of gaps),
# where the default loop hides ~90% of them in its graph. The optimized HLO of the two loops differs only by the
# kernel's `__gpu$xla.gpu.triton` custom calls, the same target as tree attention's (which does not stop the graph).
# This compiles and runs the tiny config's AR loop both ways with XLA's command-buffer logging on, and keeps the
# lines that name command buffers. Look for a thunk or command the kernel's loop leaves outside, or a WHILE that is
# not converted.
#   bash bench/next/k_graphs.sh            (writes $OUT/graphs-{default,gdn_decode}.log and .txt)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
OUT=${OUT:?}
for F in default gdn_decode; do
  if [ $F = gdn_decode ]; then export JAXSPEC_GDN_DECODE=pallas_triton; else unset JAXSPEC_GDN_DECODE; fi
  TF_CPP_MIN_LOG_LEVEL=0 \
  TF_CPP_VMODULE=command_buffer_conversion_pass=3,command_buffer_scheduling=3,command_buffer_thunk=2,command_buffer_cmd=2,command_buffer_cmd_emitter=3 \
    timeout 120 python -m bench.rounds --config tiny --context 64 --phases ar --rounds-only --ar-rounds 2 --rounds 2 \
    --k 2 --budgets 4 --round-budget 4 --max-len 512 --out $OUT/graphs-$F.json > $OUT/graphs-$F.log 2>&1
  echo "$F rc=$?"
  grep -i "command.buffer\|CommandBuffer\|while" $OUT/graphs-$F.log > $OUT/graphs-$F.txt
  wc -l < $OUT/graphs-$F.txt
done
