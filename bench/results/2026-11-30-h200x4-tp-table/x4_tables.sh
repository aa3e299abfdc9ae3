#!/bin/bash
# #9 on nvidia-h200-x4, call 1 (<= 9.5 min): the TP = 1 / 2 / 4 table at 1K and 32K, real 27B shape, random bf16
# weights, every row from this one commit and machine. Phase A, side by side: TP = 1 (AR + verify on GPU 0; DFlash +
# DDTree(64) on GPU 1) and TP = 2 (GPUs 2,3). Phase B: TP = 4 on all four, with the all-reduce microbench.
# Prediction (16-layer TP = 2 profile of session 8: gemms halve, the ~0.9 ms of small kernels and ~0.5 ms of gaps
# per 16 layers do not): TP = 4 AR round ~9-9.5 ms at 1K, ~0.6x TP = 1 (~15.3); the 0.35x goal is not met.
# JAXSPEC_COMMIT=<hash> bash bench/next/x4_tables.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=/tmp/x4; mkdir -p $R
trap '(cd $R && tar czf $OUT/x4_tables.tgz .); cat $R/a.log; grep -h "_round {\|verify[0-9]* {\|allreduce" $R/*.log | cut -c1-160' EXIT
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt 2>&1
tp() {  # name cuda deadline args...
  local name=$1 cuda=$2 dl=$3; shift 3
  CUDA_VISIBLE_DEVICES=$cuda timeout $((dl + 40)) python -m bench.tp --config real --contexts 1024,32768 --skip-identity \
    --deadline-s $dl --out $R/$name.json "$@" > $R/$name.log 2>&1
  echo "$name rc=$? $(el)s" >> $R/a.log
}
tp tp1-a 0 200 --tp 1 --methods ar,verify &
tp tp1-b 1 200 --tp 1 --methods dflash,ddtree64 &
tp tp2 2,3 250 --tp 2 &
wait
REST=$(( 560 - $(el) ))
tp tp4 0,1,2,3 $((REST - 45)) --tp 4
