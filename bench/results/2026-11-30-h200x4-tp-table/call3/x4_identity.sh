#!/bin/bash
# #9 on nvidia-h200-x4, call 3 (<= 9.5 min): TP = 4 and TP = 2 against TP = 1 token identity (greedy AR, DFlash,
# DDTree(64); bench.tp's identity model: real widths and head counts, 5 layers, fp32), the two runs side by side.
# (Call 2 ran them without --identity-layers: a 64-layer fp32 model does not fit one GPU, OOM.)
# JAXSPEC_COMMIT=<hash> bash bench/next/x4_identity.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=/tmp/x4i; mkdir -p $R
trap '(cd $R && tar czf $OUT/x4_identity.tgz .); cat $R/a.log; grep -h "identity\|Error" $R/*.log | cut -c1-160' EXIT
idn() {  # tp cuda
  CUDA_VISIBLE_DEVICES=$2 timeout 540 python -m bench.tp --config real --tp $1 --identity-layers 5 --new 24 --contexts "" \
    --deadline-s 500 --out $R/tp$1-identity.json > $R/tp$1-identity.log 2>&1
  echo "tp$1-identity rc=$? $(el)s" >> $R/a.log
}
idn 4 0,1,2,3 & idn 2 2,3 & wait
