#!/bin/bash
# Next GPU session, #8, the call right after `bench/next/d_pair.sh` WITHOUT KEEP (so that the machine stays warm
# and /tmp/dp/work/pair is still there): the pair's 2-layer drafter grown to 4 layers (identity-initialised, as
# the shipped drafter was) and trained for ~7 more minutes on 65536 fresh greedy continuations of the set-apart
# stdlib files. Session 14's pair at this point: tau DFlash 1.85 on the shipped prompts, the drafter agreeing
# with the target's first token 0.83 of the time where the target is >= 99% sure (the shipped drafter: 0.89,
# with ~5x the steps). Prediction: first-draft agreement up, tau(DFlash) ~2.1-2.3 on the shipped prompts.
# The pair comes back (pair.tar.*) for the CPU evaluation; the machine is released while it transfers.
# AGAIN=1: a further call on the same warm machine, the drafter the last d_more.sh call left trained on (no growth)
# for ~8 more minutes on another 65536 continuations. Session 17 (bench/results/2026-12-01-h200-s17-pair-v1024): one
# d_more.sh call took the first-token agreement 0.56 -> 0.62 and tau(DFlash) 1.90 -> 2.20.
# Session 18 (bench/results/2026-12-01-h200-s18-pair-4096-grown), 4096-token target: d_more.sh then AGAIN=1 left
# tau(DFlash) at 1.79 and 1.79 while the training loss fell 2.17 -> 1.92. The prompts all came from the 29
# set-apart stdlib files of this image (0.14 M tokens, for 180 K prompts); probably the drafter learns those files'
# continuations rather than the target (not yet tested). PACKAGES=N (default 3000) adds N .py files of the image's
# installed packages (`jaxspec.train drafter --package-text`; on the CPU host, 3000 of them and the stdlib's 462
# test files were 21 M tokens: bench/results/2026-12-01-cpu-s18-demo-drafter-packages/train.log) to the prompts'
# text; PACKAGES=0 is session 18's recipe. Since session 19's last commits the files come from the packages'
# "prompts" half (`package_files(part=)`), the one `pair --package-text` never trains a target on; session 19's
# calls drew from all of them.
# Prediction with PACKAGES=3000 on a fresh d_pair.sh pair: tau(DFlash) 2.0-2.4 after d_more.sh and 2.2-2.6 after
# AGAIN=1 on the shipped prompts (against 1.79 / 1.79), depth-1 agreement 0.52 -> 0.58-0.65.
# PAIR=<dir>: a pair made earlier (target/ and drafter/, e.g. carried as the ignored /.pair/), instead of d_pair.sh's
# on this machine: its drafter goes on as it is (no growth), so that no d_pair.sh call is needed. Session 18's
# call-3 pair (51 MB) was kept on the CPU host at /tmp/jaxspec-s18-pair. Session 25's pair is committed:
# PAIR=bench/results/2026-12-02-h200-s25-pair-stdlib08/pair (bench/NOTES.md, "Plan for the next GPU session").
# DRAFTER=<dir> (with PAIR): start from that drafter instead of PAIR/drafter (session 27 kept one without its target).
# Since session 29 the target's features are made inside each step (--features live) instead of a ~39 GB cache, so a
# call trains on 196608 continuations (each seen ~4 times rather than ~16), and the loss on 2048 continuations never
# trained on comes back in val_loss.json (bench/results/2026-12-03-h200-s29-live: held-out loss 3.32 -> 3.26 in one
# call, where the cached calls had flattened at ~3.34). CACHE=1: the cached recipe of sessions 14-28.
# JAXSPEC_COMMIT=<hash> [AGAIN=1] [SEED=N] [PACKAGES=N] [PAIR=dir [DRAFTER=dir]] bash bench/next/d_more.sh   (EXTRA="--sequences 24 --gen-batch 8 --steps 6 --batch 4 --val-sequences 8": a CPU dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
P=/tmp/dp/work/pair; [ -d $P ] || P=/dev/shm/dp/work/pair     # where d_pair.sh worked
[ -n "$PAIR" ] && P=$(realpath "$PAIR")
W=/tmp/dm; mkdir -p $W/keep
[ -d $P/target ] || { echo "no $P/target: the machine is not the one d_pair.sh ran on"; exit 1; }
# With CACHE=1 this call writes a ~39 GB feature cache; the disk has 64 GiB. Session 16 ran it while d_pair.sh's
# ~36 GB of caches were still there: ~130 s in, the machine stopped answering and its work was lost. d_pair.sh now
# deletes them as it ends; df.txt records what was free.
DATA="--features live --val-sequences 2048 --sequences 196608 --gen-batch 8192"
[ "$CACHE" = 1 ] && DATA="--sequences 65536 --gen-batch 4096"
if [ "$AGAIN" = 1 ]; then
  [ -d $W/run/drafter ] || { echo "no $W/run/drafter: no d_more.sh call ran on this machine"; exit 1; }
  rm -rf $W/prev && mv $W/run/drafter $W/prev && rm -rf $W/run $W/pack
  FROM="--init $W/prev"; SEED=${SEED:-16}      # another SEED for each further call: other continuations
elif [ -n "$PAIR" ]; then
  D=$P/drafter; [ -n "$DRAFTER" ] && D=$(realpath "$DRAFTER")   # DRAFTER=<dir>: another drafter for PAIR's target
  [ -d $D ] || { echo "no $D"; exit 1; }
  FROM="--init $D"; SEED=${SEED:-15}
else
  FROM="--init $P/drafter --grow-layers 2"; SEED=${SEED:-15}
fi
df -h /tmp > $W/df.txt
finish() {
  cp $W/run/drafter_loss.png $W/run/val_loss.json $W/train.log $W/df.txt $W/keep/ 2>/dev/null
  (cd $W/keep && tar czf $OUT/more-run.tgz .)
  if [ -d $W/run/drafter ]; then
    mkdir -p $W/pack/demo && cp -r $W/run/drafter $W/pack/demo/
    [ -n "$PAIR" ] || cp -r $P/target $W/pack/demo/     # with PAIR the target is in the repository already
    (cd $W/pack && tar cf - demo | split -b 15m -d - $OUT/pair.tar.)
  fi
  rm -rf $W/run/greedy_features        # ~39 GB; the disk carries over to an AGAIN=1 call
  grep -h "loss\|done\|data:\|rc=" $W/train.log | grep -v "step [0-9]*/" | tail -12
}
trap finish EXIT
python -c "
from jaxspec import train
print('\n'.join(map(str, train.split_files(train.stdlib_files(), unseen=True)[2])))" > $W/unseen.txt
timeout 540 python -m jaxspec.train drafter --target $P/target --text $(cat $W/unseen.txt) --mask-token-id 1 \
  --package-text ${PACKAGES:-3000} \
  $FROM --data greedy $DATA --batch 64 --anchors 16 \
  --steps 80000 --lr 6e-4 --gamma 4 --ckpt-every 10000 --dtype bfloat16 --shard-mb 15 --seed $SEED --time-budget-s 500 \
  --out $W/run $EXTRA > $W/train.log 2>&1
echo "drafter rc=$?" >> $W/train.log
