#!/bin/bash
# Next GPU session, #8 (nvidia-h200, <= 9.5 min, one call): a 384-wide demo target stopped after 4 passes over its
# stream (the 16-epoch one memorised its split: loss 0.19), and a drafter trained on its greedy continuations of
# prompts from stdlib files it never trained on (pair --drafter-prompts unseen, the default since session 13),
# then the held-out evaluation in the same call. Only results.json, the loss PNGs and the log come back unless
# KEEP=1 (then also the pair's parts, ~45 MB: the last call of the session only, the machine is released while
# they transfer). Prediction: held-out tau(DFlash) above the shipped pair's 1.85 (this shape with 16 epochs and
# training-split prompts: 1.17); tau >= 4 is not expected from this alone.
# JAXSPEC_COMMIT=<hash> [KEEP=1] bash bench/next/d_pair.sh     (EXTRA="--tiny --time-budget-s 60": a CPU dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/dp; mkdir -p $W
finish() {
  cp $W/out/results.json $W/out/*.png $OUT/ 2>/dev/null; gzip -c $W/pair.log > $OUT/pair.log.gz
  [ "$KEEP" = 1 ] && cp $W/out/pair.tar.* $OUT/ 2>/dev/null
  grep -h "tau\|loss\|epochs\|done" $W/pair.log | tail -25
}
trap finish EXIT
timeout 560 python -m jaxspec.train pair --out $W/out --work $W/work --target-width 384 --target-max-epochs 4 \
  --drafter-data greedy --time-budget-s 540 $EXTRA > $W/pair.log 2>&1
echo "pair rc=$?" >> $W/pair.log
