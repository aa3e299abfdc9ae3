#!/bin/bash
# Next GPU session, #6 (nvidia-h200, one call, ~6-7 min): do WHILE / CONDITIONAL command buffers help the
# speculative rounds as they help the AR loop? Session 22 (bench/results/2026-12-01-h200-s22-loop-graphs-v65): with
# `--xla_gpu_enable_command_buffer=...,WHILE,CONDITIONAL` the engine's AR loop took 14.43 ms a round (4 calls queued)
# against 15.19 ms without, in one lease (the bare step: 15.00 / 14.95); but a later call with the flag timed the
# DFlash round at 20.00 ms queued and DDTree(64) at 27.17, against 19.14 and ~26.6-27.2 in earlier leases without
# it. That comparison crosses leases, so this call times all three loops both ways in one lease.
# Predicted: AR -0.5 to -0.8 ms with the flag (as in session 22); DFlash and DDTree within +-0.3 ms of the default
# (their loop bodies are longer, so the predicate's host round trip is a smaller share). If the spec rounds get
# slower with the flag by more than 0.3 ms, XLA is splitting their bodies into several graphs (the top kernels'
# counts per round do not show this; a dump of the command buffer thunks would).
# JAXSPEC_COMMIT=<hash> bash bench/next/k_graphs.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kg; mkdir -p $W
trap '(cd $W && tar czf $OUT/kg.tgz .); grep -h "rc=\|_round {\|ar_step {" $W/*.log' EXIT
GRAPHS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
for run in default graphs; do
  flags=""; [ $run = graphs ] && flags=$GRAPHS
  XLA_FLAGS="$flags" timeout 285 python -m bench.rounds --config real --context 1024 --phases ar,dflash,ddtree \
    --rounds-only --out $W/$run.json > $W/$run.log 2>&1
  echo "$run rc=$?" >> $W/$run.log
done
