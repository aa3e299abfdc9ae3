#!/bin/bash
# nvidia-h200-x2. MODE=tp2: a 16-layer TP1-vs-TP2 AR check of the embedding fix, then the full TP2 table.
# MODE=tp1: the full TP1 table split over the two GPUs, then the TP2 identity check (5 layers, fp32).
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jc
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
if [ "$MODE" = tp2 ]; then
  python -m bench.tp --config real --tp 2 --layers 16 --contexts 1024 --skip-identity --methods ar \
    --out $OUT/tp2-16layers.json > $OUT/tp2-16layers.log 2>&1
  echo "16-layer check done $(el)s" >> $OUT/table.log
  python -m bench.tp --config real --tp 2 --contexts 1024,32768 --skip-identity --deadline-s $((540 - $(el))) \
    --out $OUT/tp2.json > $OUT/tp2.log 2>&1
  echo "tp2 rc=$? $(el)s" >> $OUT/table.log
else
  CUDA_VISIBLE_DEVICES=0 timeout 400 python -m bench.tp --config real --tp 1 --contexts 1024,32768 --skip-identity \
    --methods ar,verify --deadline-s 240 --out $OUT/tp1-a.json > $OUT/tp1-a.log 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 400 python -m bench.tp --config real --tp 1 --contexts 1024,32768 --skip-identity \
    --methods dflash,ddtree64 --deadline-s 240 --out $OUT/tp1-b.json > $OUT/tp1-b.log 2>&1 &
  wait
  echo "tp1 done $(el)s" >> $OUT/table.log
  timeout $((570 - $(el))) python -m bench.tp --config real --tp 2 --identity-layers 5 --new 24 --contexts 1024 \
    --methods ar --rounds 4 --deadline-s 0 --out $OUT/tp2-identity.json > $OUT/tp2-identity.log 2>&1
  echo "identity rc=$? $(el)s" >> $OUT/table.log
fi
cat $OUT/table.log
