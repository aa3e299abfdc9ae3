#!/bin/bash
# #6 (either card, one call, ~8 min on the real shape): XLA options the round loops have not been timed with, one
# run each in one lease, the DFlash and DDTree(63) rounds at 1K. Session 59 found one such option worth 3 ms on an
# H100 (the memory-limit slop factor, now engine.MEMORY_OPTIONS); these are the ones not yet timed:
#   base     the engine's options as they are (loop graphs, split-K 1 for 64 nodes, slop factor 100)
#   slop95   XLA's default slop factor (95) back (with this 8K cache no card is near its limit: a control)
#   lhs      --xla_gpu_enable_latency_hiding_scheduler=true: a schedule that overlaps independent work; on one GPU
#            its effect on the loop's idle gaps (1.5 ms a DDTree round on an H100 at 38K, session 58) is unknown
#   cublaslt --xla_gpu_enable_cublaslt=true: cuBLASLt for the products XLA sends to cuBLAS (the 64-row MLP)
#   dbuf     --xla_gpu_enable_while_loop_double_buffering=true: the round loop unrolled by two, buffers alternating
# Predicted (written in session 59): each within 0.3 ms of base, which no one run can separate from the spread
# (0.39-0.47 ms in DDTree(63) between identical runs, sessions 50 and 52); a variant >= 0.5 ms shorter in either round
# earns a repeat (ORDER="base X base X") before it is set beside MEMORY_OPTIONS.
#   OUT=... bash bench/next/k_xla_flags.sh    (ORDER="base lhs ..." to choose; CONFIG=tiny JAX_PLATFORMS=cpu dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
trap 'tar czf $OUT/xla-flags.tgz -C $W .' EXIT     # one file back: the device returns at most 8 (session 60 lost 4)
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt 2>/dev/null
START=$SECONDS
i=0
for v in ${ORDER:-base slop95 lhs cublaslt dbuf}; do
  case $v in
    base) F="";;
    slop95) F="--xla_gpu_memory_limit_slop_factor=95";;
    lhs) F="--xla_gpu_enable_latency_hiding_scheduler=true";;
    cublaslt) F="--xla_gpu_enable_cublaslt=true";;
    dbuf) F="--xla_gpu_enable_while_loop_double_buffering=true";;
    *) echo "unknown variant $v"; exit 2;;
  esac
  i=$((i + 1))
  XLA_FLAGS="$F" timeout 150 python -m bench.rounds --config $CONFIG --context 1024 --phases dflash,ddtree \
    --rounds-only --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$i-$v.json > $W/rounds-$i-$v.log 2>&1
  echo "rounds $i $v rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-$i-$v.log | cut -c1-100
done
