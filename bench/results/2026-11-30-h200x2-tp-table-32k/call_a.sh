#!/bin/bash
# nvidia-h200-x2, session 8. (1) the GPU collectives test; (2) 16-layer probe: TP1 AR / DDTree64 and TP2 AR,
# default XLA flags vs WHILE+CONDITIONAL command buffers (the round loop as one CUDA graph); TP2 AR profiled;
# (3) TP1 rows at 1K+32K, 64 layers, split over the two GPUs (state made leafwise now).
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
WH="--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
JAX_PLATFORMS=cuda timeout 150 python -m pytest -q -m gpu tests/test_sharding.py > $OUT/gpu_sharding_test.log 2>&1
echo "gpu test rc=$? $(el)s" >> $OUT/a.log
run() {  # name tp method cuda flags...
  local name=$1 tp=$2 method=$3 cuda=$4; shift 4
  local d=/tmp/p/$name; mkdir -p $d
  local prof=""; [ "$PROF" = 1 ] && prof="--profile $d/prof"
  CUDA_VISIBLE_DEVICES=$cuda XLA_FLAGS="--xla_dump_to=$d/hlo --xla_dump_hlo_as_text $*" timeout 150 python -m bench.tp \
    --config real --tp $tp --layers 16 --contexts 1024 --skip-identity --methods $method --rounds 8 $prof \
    --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "$name rc=$? $(el)s flags='$*'" >> $OUT/a.log
  local hlo=$(ls -S $d/hlo/*run_rounds*after_optimizations.txt 2>/dev/null | head -1)
  [ -n "$hlo" ] && echo "  $name hlo: $(grep -c 'command_buffer' $hlo) command_buffer lines, $(grep -c ' while(' $hlo) while" >> $OUT/a.log
  x=$(ls $d/prof/*_rounds.xplane.pb 2>/dev/null | head -1)
  [ -n "$x" ] && [ -n "$hlo" ] && python -m bench.profile $x $hlo --device 0 --steps 16 --top 30 > $OUT/$name.profile.txt 2>&1
}
run tp1_ar 1 ar 0 & run tp1_ar_while 1 ar 1 $WH & wait
run tp1_ddtree 1 ddtree64 0 & run tp1_ddtree_while 1 ddtree64 1 $WH & wait
PROF=1 run tp2_ar 2 ar 0,1
run tp2_ar_while 2 ar 0,1 $WH
echo "probe done $(el)s" >> $OUT/a.log
REST=$(( 560 - $(el) ))
if [ $REST -gt 120 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout $REST python -m bench.tp --config real --tp 1 --contexts 1024,32768 --skip-identity \
    --methods ar,verify --deadline-s $((REST - 60)) --out $OUT/tp1-a.json > $OUT/tp1-a.log 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout $REST python -m bench.tp --config real --tp 1 --contexts 1024,32768 --skip-identity \
    --methods dflash,ddtree64 --deadline-s $((REST - 60)) --out $OUT/tp1-b.json > $OUT/tp1-b.log 2>&1 &
  wait
fi
echo "all done $(el)s" >> $OUT/a.log
cat $OUT/a.log
