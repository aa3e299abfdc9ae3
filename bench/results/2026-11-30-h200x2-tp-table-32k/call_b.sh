#!/bin/bash
# nvidia-h200-x2, session 8, call B. (1) 16-layer probe again (call A's files did not come back): TP1 AR and
# TP2 AR, default XLA flags vs WHILE+CONDITIONAL command buffers; TP2 AR profiled. (2) the TP2 table, 64
# layers, 1K + 32K. Everything tarred into $OUT/b.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=/tmp/r; mkdir -p $R
WH="--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"
finish() { echo "all done $(el)s" >> $R/b.log; (cd $R && tar czf $OUT/b.tgz --exclude='*.pb' --exclude=hlo .); cat $R/b.log; }
trap finish EXIT
run() {  # name tp method cuda flags...
  local name=$1 tp=$2 method=$3 cuda=$4; shift 4
  local d=/tmp/p/$name; mkdir -p $d
  local prof=""; [ "$PROF" = 1 ] && prof="--profile $d/prof"
  CUDA_VISIBLE_DEVICES=$cuda XLA_FLAGS="--xla_dump_to=$d/hlo --xla_dump_hlo_as_text $*" timeout 150 python -m bench.tp \
    --config real --tp $tp --layers 16 --contexts 1024 --skip-identity --methods $method --rounds 8 $prof \
    --out $R/$name.json > $R/$name.log 2>&1
  echo "$name rc=$? $(el)s flags='$*' $(grep -o "_round {'median_ms': [0-9.]*" $R/$name.log)" >> $R/b.log
  local hlo=$(ls -S $d/hlo/*run_rounds*after_optimizations.txt 2>/dev/null | head -1)
  x=$(ls $d/prof/*_rounds.xplane.pb 2>/dev/null | head -1)
  [ -n "$x" ] && [ -n "$hlo" ] && python -m bench.profile $x $hlo --device 0 --steps 16 --top 30 > $R/$name.profile.txt 2>&1
  ls $d/hlo | grep -i -m3 "thunk\|command" >> $R/b.log
}
run tp1_ar 1 ar 0 & run tp1_ar_while 1 ar 1 $WH & wait
PROF=1 run tp2_ar 2 ar 0,1
run tp2_ar_while 2 ar 0,1 $WH
echo "probe done $(el)s" >> $R/b.log
REST=$(( 560 - $(el) ))
timeout $REST python -m bench.tp --config real --tp 2 --contexts 1024,32768 --skip-identity --deadline-s $((REST - 50)) \
  --out $R/tp2.json > $R/tp2.log 2>&1
echo "tp2 rc=$? $(el)s" >> $R/b.log
