#!/bin/bash
# Probe on nvidia-h200-x2: L real-width layers at 1K. TP1 AR / DFlash / DDTree64 (xla vs pallas delta rule)
# two at a time on the two GPUs, then TP2 AR with XLA flag variants. Profiles analysed here.
export PYTHONPATH=. XLA_FLAGS_EXTRA= PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
L=${L:-16}
run() {  # name tp method envspec flags...
  local name=$1 tp=$2 method=$3 envs=$4; shift 4
  local d=/tmp/p/$name; mkdir -p $d
  local t0=$(date +%s)
  env $envs XLA_FLAGS="--xla_dump_to=$d/hlo --xla_dump_hlo_as_text $*" timeout $(left $1) python -m bench.tp --config ${CONFIG:-real} \
    --tp $tp --layers $L --contexts 1024 --skip-identity --methods $method --rounds 8 --profile $d/prof \
    --out $d/tp.json > $d/log.txt 2>&1
  local rc=$?
  local hlo=$(ls -S $d/hlo/*after_optimizations.txt 2>/dev/null | head -1)
  {
    echo "== $name tp=$tp $method env='$envs' flags='$*' rc=$rc $(( $(date +%s)-t0 ))s"
    grep -E "allreduce|_round \{|rror" $d/log.txt | grep -v "^ " | head -6
    if [ -n "$hlo" ]; then
      echo "hlo $hlo: $(grep -c command_buffer $hlo) command_buffer lines"
      grep -oE "all-reduce-start|all-reduce\(|all-reduce-done|custom-call-start|while\(" $hlo | sort | uniq -c
    fi
  } > $d/summary.txt
  x=$(ls $d/prof/*_rounds.xplane.pb 2>/dev/null | head -1)
  if [ -n "$x" ] && [ -n "$hlo" ]; then
    python -m bench.profile $x $hlo --device 0 --steps 16 --top 40 > $d/profile.txt 2>&1
  fi
}
T0=$(date +%s)
left() {  # seconds this run may take: its cap, and never past 560 s of the call
  local cap=130; case $1 in tp2_ar) cap=170;; esac
  local rest=$(( 560 - ($(date +%s) - T0) )); [ $rest -lt $cap ] && cap=$rest; [ $cap -lt 1 ] && cap=1; echo $cap
}
run tp1_ar 1 ar "CUDA_VISIBLE_DEVICES=0" & run tp1_ddtree_xla 1 ddtree64 "CUDA_VISIBLE_DEVICES=1" & wait
run tp1_ddtree_pallas 1 ddtree64 "CUDA_VISIBLE_DEVICES=0 JAXSPEC_TREE_DELTA_RULE=pallas_triton" &
run tp1_dflash 1 dflash "CUDA_VISIBLE_DEVICES=1" & wait
echo "tp1 done $(( $(date +%s)-T0 ))s" > $OUT/probe.txt
run tp2_ar 2 ar ""
run tp2_ar_oneshot 2 ar "" --xla_gpu_unsupported_use_all_reduce_one_shot_kernel=true
[ $(( $(date +%s)-T0 )) -lt 450 ] && run tp2_ar_cbcoll 2 ar "" --xla_gpu_enable_command_buffer=+COLLECTIVES
for d in /tmp/p/*/; do cat $d/summary.txt >> $OUT/probe.txt; echo "-- profile $d" >> $OUT/profiles.txt; cat $d/profile.txt >> $OUT/profiles.txt 2>/dev/null; done
cd /tmp/p && tar czf $OUT/probe.tgz */tp.json */log.txt $(for n in tp1_ar tp2_ar tp1_ddtree_xla; do ls -S $n/hlo/*after_optimizations.txt 2>/dev/null | head -1; done)
echo "total $(( $(date +%s)-T0 ))s" >> $OUT/probe.txt
