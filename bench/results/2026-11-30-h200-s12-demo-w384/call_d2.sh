#!/bin/bash
# Next GPU session, #8 calls 2 and 3 (nvidia-h200, warm after call 1): continue the 384-wide pair's drafter on
# 65536 fresh greedy continuations of prompts from the target's own training files (the pair's split of the
# image's stdlib; the held-out evaluation text is this CPU's pyenv stdlib files the image lacks).
# JAXSPEC_COMMIT=<hash> SEED=21 FROM=.gpu/w384/pair/drafter RUN=.gpu/run2 bash bench/next/d2_drafter_more.sh
# (call 3: SEED=22 FROM=.gpu/run2/drafter RUN=.gpu/run3). The drafter, log and loss curve come back in d2.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
SEED=${SEED:-21} FROM=${FROM:-.gpu/w384/pair/drafter} RUN=${RUN:-.gpu/run2}
mkdir -p /tmp/d2
trap 'cp $RUN/drafter_loss.png /tmp/d2/ 2>/dev/null; cp -r $RUN/drafter /tmp/d2/ 2>/dev/null; (cd /tmp/d2 && tar czf $OUT/d2.tgz .); tail -5 /tmp/d2/train.log' EXIT
TRAIN_FILES=$(python -c "from jaxspec.train import stdlib_files, split_files; print(' '.join(map(str, split_files(stdlib_files())[0])))")
JAX_PLATFORMS=cuda timeout $(( ${BUDGET:-520} + 45 )) python -m jaxspec.train drafter --target .gpu/w384/pair/target --text $TRAIN_FILES \
  --mask-token-id 1 --init $FROM --data greedy --prompt-len 64 --gen-new 192 --gen-batch 4096 --sequences 65536 \
  --batch 64 --anchors 16 --steps 80000 --lr 6e-4 --ckpt-every 10000 --dtype bfloat16 --seed $SEED \
  --time-budget-s ${BUDGET:-520} --out $RUN > /tmp/d2/train.log 2>&1
echo "rc=$?" >> /tmp/d2/train.log
