#!/bin/bash
# Next GPU session, #8 (nvidia-h200, one call, <= 9.5 min): does a smaller vocabulary make the demo target's greedy
# continuations easier to draft? tau counts tokens; with a 1024-token BPE instead of 4096, code is cut into ~1.3-1.5x
# as many tokens and more of them complete a word or an operator the previous ones began, which a drafter can
# predict from the target's features. Same recipe as d_pair.sh (384 wide, mixed drafter data, 49152 continuations),
# with the held-out evaluation on this machine (no --no-eval): tau for DFlash and DDTree 16 / 32 / 64, token
# identity to AR, and the speedup, on its own held-out files. Compare with session 14's 4096-token pair on its own
# held-out files (bench/results/2026-12-01-h200-s14-demo-w384-mixed: DFlash 1.95, DDTree(64) 2.98).
# Prediction: tau(DFlash) 2.3-2.8, DDTree(64) 3.3-3.9; >= 4 for DFlash not expected. Speedup over AR in
# tokens/s rises with tau; per character of code it rises less (the AR step also makes fewer characters).
# JAXSPEC_COMMIT=<hash> [KEEP=1] bash bench/next/d_vocab.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/dv
[ "$(df --output=avail -BG /tmp | tail -1 | tr -dc 0-9)" -lt 50 ] && W=/dev/shm/dv
mkdir -p $W/keep
finish() {
  df -h /tmp /dev/shm >> $W/pair.log
  cp $W/out/results.json $W/out/*.png $W/keep/ 2>/dev/null; cp $W/pair.log $W/keep/
  (cd $W/keep && tar czf $OUT/vocab-run.tgz .)
  [ "$KEEP" = 1 ] && cp $W/out/pair.tar.* $OUT/ 2>/dev/null
  rm -rf $W/work/features $W/work/greedy_features $W/work/greedy.npy      # the disk carries over to the next call
  grep -h "tau\|loss\|epochs\|done\|data:\|rc=" $W/pair.log | tail -25
}
trap finish EXIT
echo "work dir $W" > $W/pair.log
timeout 565 python -m jaxspec.train pair --out $W/out --work $W/work --target-width 384 --drafter-data mixed \
  --vocab 1024 --gen-sequences 49152 --gen-batch 4096 --time-budget-s 545 $EXTRA >> $W/pair.log 2>&1
echo "pair rc=$?" >> $W/pair.log
