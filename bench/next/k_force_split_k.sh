#!/bin/bash
# Settled in session 54 (bench/results/2026-12-05-h200-s54/force-split-k/), ORDER="default 1 default 1": S = 1 is
# 0.22 ms shorter in DDTree(63) (means 20.40 -> 20.17), 0.05 longer in DFlash (17.36 -> 17.41) and 0.80 longer in
# the AR step (13.33 -> 14.13). Not set; record only.
# Ran in session 53 (bench/results/2026-12-05-h200-s53/force-split-k/), one run each: DFlash 17.52 / 17.61 / 17.92 /
# 18.34 ms, DDTree(63) 20.64 / 20.41 / 21.13 / 22.06 (default / S = 1 / 2 / 4). Not set: S = 1 was 0.23 ms shorter in
# DDTree(63) but 0.09 longer in DFlash, both inside one run's spread (0.47 ms in session 52). To settle S = 1:
#   ORDER="default 1 default 1" OUT=... bash bench/next/k_force_split_k.sh   (~7.5 min; keep S = 1 by the rule below
#   on the means of two).
# #6 (nvidia-h200, one call, ~6 min): XLA's split-K for the verify's products, forced to 1, 2 or 4 splits.
# In session 46's DDTree(63) round (bench/results/2026-12-04-h200-s46/call2-round-trace/, optimized HLO) the GDN in_proj
# product at 64 rows is split in two along K: it writes f32[2, 64, 16480] (8.4 MB), and two fusions a layer sum the
# halves again (loop_convert_fusion.47, the norm scale and bf16 cast: 3.9 us; loop_convert_fusion.95, the z gate:
# 2.2 us): 0.29 ms a round over 48 layers (0.20 at 16 rows, DFlash). In the DFlash round the MLP's down product at
# 16 rows is split in 8 (f32[8, 16, 5120]) and the residual add sums the partials: 126 fusions of 2 us, 0.26 ms.
# `xla_gpu_enable_split_k_autotuning` is gone from this jaxlib (a reserved name);
# `--xla_gpu_experimental_force_split_k=S` forces S K splits on every Triton product.
#   The rounds at 1K, default then with S = 1, 2, 4, one lease. Predicted for S = 1: the split-K sums leave (0.4-0.5
#   ms of kernels in DFlash, ~0.3 in DDTree(63)), but a 16-row product with N = 5120 has too few programs to stream
#   its weights without splitting K: the products get 0.3-1.0 ms longer. Net: DFlash +0.5..-0.2 ms, DDTree(63)
#   +0.3..-0.2; S = 2 / 4 between. Upside not in that range: with no K split, XLA may fuse the residual add into the
#   next norm's sum of squares (127 `input_convert_reduce_fusion` of ~1.7 us, 0.22 ms, which a reduction producer
#   blocks today); if a round moves more than predicted, trace it with the flag (bench/next/k_round_trace.sh).
#   If a round is >= 0.2 ms shorter and neither longer: set the flag
#   (engine.py, beside LOOP_GRAPH_OPTIONS: the loop's compile options), with this run as the reason; else drop it.
#   OUT=... bash bench/next/k_force_split_k.sh     (writes $OUT/force-split-k.tgz; CONFIG=tiny JAX_PLATFORMS=cpu dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
trap 'tar czf $OUT/force-split-k.tgz -C $W .' EXIT
rounds() {  # NAME [XLA flags]
  local flags; flags=$(echo $XLA_FLAGS $2)      # never a lone space: XLA reads that as a file name
  XLA_FLAGS="$flags" timeout 140 python -m bench.rounds --config $CONFIG --context 1024 --phases ddtree,dflash \
    --rounds-only --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$1.json > $W/rounds-$1.log 2>&1
  echo "rounds $1 rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-$1.log | cut -c1-120
}
# ORDER (e.g. "default 1 default 1"): these runs in this order instead, each file named with its place in it.
i=0
for S in ${ORDER:-default ${SPLITS:-1 2 4}}; do
  i=$((i + 1)); tag=${ORDER:+-$i}
  if [ "$S" = default ]; then rounds default$tag; else rounds force$S$tag --xla_gpu_experimental_force_split_k=$S; fi
done
