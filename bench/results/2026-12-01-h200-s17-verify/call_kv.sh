#!/bin/bash
# Next GPU session, #6 (nvidia-h200, one call, <= 9.5 min): the verify kernel's vocabulary splits, then the table.
# Session 16 (bench/results/2026-12-01-h200-s16-count) read 64 rows x 248320 fp32 logits (63.6 MB) in ~125 us of
# one call's wall time: 12.7% of the harness's copy. The kernel runs `splits` programs per row, each walking its
# slice in tiles of 2048; the default for 64 rows is 2 x 132 SMs // 64 = 4 splits, 256 programs, each with a serial
# chain of 30 tile loads. Prediction: the bench's device time (new in e80ed3c) shows the kernel itself at 80-110 us;
# 16 splits (1024 programs, 8 tiles each) bring it to <= 40 us, >= 40% of copy; 32 splits no better than 16.
# Every variant must choose the default's tokens (the bench stops otherwise). If 16 wins, make default_splits give
# ~8 x SMs programs and re-time the table: the verify rows -0.05 to -0.08 ms, the rounds within noise.
# JAXSPEC_COMMIT=<hash> [LIMIT=560] bash bench/next/k_verify.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kv; mkdir -p $W
trap '(cd $W && tar czf $OUT/kv.tgz .); grep -h "rc=\|pallas_triton\|passed\|failed" $W/*.log | tail -24; cat $W/t/table.md 2>/dev/null' EXIT
T0=$(date +%s); at() { echo $(( $(date +%s) - T0 )); }
timeout 120 python -m pallas_kernels.verify.bench --rows 16,64,65 --impls pallas_triton --splits 2,8,16,32 \
  --json $W/verify_splits.json > $W/verify_splits.log 2>&1
echo "verify splits rc=$? at $(at)" >> $W/verify_splits.log
timeout $(( ${LIMIT:-560} - $(at) )) python -m bench.table --config real --contexts 1024,32768,131072 --budget 63 \
  --deadline-s $(( ${LIMIT:-560} - 20 - $(at) )) --out $W/t > $W/table.log 2>&1
echo "table rc=$? at $(at)" >> $W/table.log
