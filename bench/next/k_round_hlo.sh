#!/bin/bash
# #6 (nvidia-h200, one call, ~3 min): does a round materialise the GDN's pre-conv inputs slice? In session 44's
# verify(16) profile (bench/results/2026-12-04-h200-s44/inputs-params/verify/) `loop_slice_fusion_2` copies the
# conv channels out of each GDN layer's in_proj product ([1, 16, 16, 1030] -> [1, 16, 16, 640] bf16, 48 kernels,
# 0.091 ms a step) for GDNPending.conv_in, which commit reads. A verify alone must write its outputs; inside a round
# the commit's window gather is the slice's only reader, so XLA may fuse it there. The DFlash and DDTree(63) rounds
# at 1K with XLA's optimized HLO dumped; the big modules' after-optimizations text is kept (gzip) and grep'd for
# slices of that shape and the fusions that read them.
# Predicted (50/50): fused into the gather in the round (then GDNPending needs no change), or materialised as in
# verify (then holding the product itself in GDNPending saves ~0.09 ms a DFlash round and ~0.1 ms a DDTree(63) round).
#   OUT=... bash bench/next/k_round_hlo.sh      (writes $OUT/round-hlo.tgz; CONFIG=tiny JAX_PLATFORMS=cpu dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
trap 'tar czf $OUT/round-hlo.tgz -C $W .' EXIT
D=$(mktemp -d)
XLA_FLAGS="--xla_dump_to=$D --xla_dump_hlo_as_text" timeout 300 python -m bench.rounds --config $CONFIG \
  --context 1024 --phases dflash,ddtree --rounds-only --budgets 63 --round-budget 63 --max-len 8192 \
  --out $W/rounds.json > $W/rounds.log 2>&1
echo "rounds rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds.log | cut -c1-200
ls -S $D/*after_optimizations.txt | head -6 | while read f; do
  b=$(basename $f .txt); echo "$b $(stat -c %s $f) bytes"
  gzip -c $f > $W/$b.txt.gz
  { echo "== $b"; grep -c "fusion(" $f; grep -n " slice(" $f | grep "640\]" | cut -c1-400 | head -20;
    grep -n "loop_slice_fusion" $f | grep "640\]" | cut -c1-400 | head -20; } >> $W/slices.txt
done
echo "at $((SECONDS - START)) s"; head -40 $W/slices.txt
