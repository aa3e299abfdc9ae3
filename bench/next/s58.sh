#!/bin/bash
# Session 58's first call: branches on the card it gets.
#   H200: #6's table (bench/next/table.sh, 3 contexts, ~9 min).
#   H100: the device memory change (624153a): a 128K cache under a 0.75 pool must be refused within a minute of the
#         weights (session 57: a 9-min stall), and under the new 90% default the 128K rounds must run.
#   OUT=... bash bench/next/s58.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
GPU=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)
echo "gpu: $GPU" | tee $OUT/gpu.txt
case "$GPU" in
  *H200*) bash bench/next/table.sh;;
  *)
    t0=$(date +%s)
    XLA_CLIENT_MEM_FRACTION=0.75 timeout 150 python -m bench.rounds --config real --context 131072 --phases ar \
      --ar-rounds 20 --k 10 > $OUT/mem075.log 2>&1
    echo "0.75 pool: rc=$? after $(( $(date +%s) - t0 )) s" | tee -a $OUT/gpu.txt
    grep -v "^WARNING: Location" $OUT/mem075.log | tail -4
    t0=$(date +%s)
    timeout 400 python -m bench.rounds --config real --context 131072 --phases ar,dflash,ddtree --rounds-only \
      --round-budget 63 --out $OUT/rounds-128k.json > $OUT/rounds-128k.log 2>&1
    echo "90% pool, 128K rounds: rc=$? after $(( $(date +%s) - t0 )) s" | tee -a $OUT/gpu.txt
    grep -v "^WARNING: Location" $OUT/rounds-128k.log | tail -25;;
esac
