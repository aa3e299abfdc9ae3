#!/bin/bash
# Next GPU session, #6 (nvidia-h200, one call, ~4-6 min): where the AR device loop's extra 0.41 ms a round goes.
# Session 21 (bench/results/2026-12-01-h200-s21-ar-loop): the bare AR step back to back 14.65 ms, the engine's AR
# loop 15.26 ms a round synced and 15.06 ms with its calls queued. `bench.rounds --trace-ar` profiles both forms
# and writes kernel time, span, gaps and kernels by part per step / round, and their difference.
# Run 1 is the default build. Run 2 adds WHILE and CONDITIONAL to XLA's command buffer types, so that the loop
# (body and predicate) may become one CUDA graph instead of a host round trip for the predicate each iteration.
# Predicted: run 1's loop_minus_step is mostly gaps (>= 0.25 ms of the 0.41) with kernels within 0.15 ms of the
# step's; if so run 2's loop comes within 0.1 ms of the bare step (<= 14.75 ms). If run 1's difference is kernels,
# its top_kernels / by_part name the engine's per-round work to fuse, and run 2 changes little.
# JAXSPEC_COMMIT=<hash> bash bench/next/k_loop.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kl; mkdir -p $W
trap '(cd $W && tar czf $OUT/kl.tgz .); grep -h "rc=\|ar_step {\|ar_round_device_loop {\|ar_trace" $W/*.log' EXIT
timeout 280 python -m bench.rounds --config real --context 1024 --phases ar --trace-ar --k 10 \
  --out $W/default.json > $W/default.log 2>&1
echo "default rc=$?" >> $W/default.log
XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL" \
  timeout 250 python -m bench.rounds --config real --context 1024 --phases ar --trace-ar --k 10 \
  --out $W/while_graph.json > $W/while_graph.log 2>&1
echo "while_graph rc=$?" >> $W/while_graph.log
