#!/bin/bash
# nvidia-h200, session 8, call C: the demo drafter grown from 2 to 4 layers (identity-initialised new layers),
# trained on 65536 fresh greedy continuations (seed 15). Drafter, log and loss curve come back in c.tgz.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
trap 'cp /tmp/run/drafter_loss.png /tmp/c/ 2>/dev/null; cp -r /tmp/run/drafter /tmp/c/ 2>/dev/null; (cd /tmp/c && tar czf $OUT/c.tgz .); tail -5 /tmp/c/train.log' EXIT
mkdir -p /tmp/c
timeout 560 python -m jaxspec.train drafter --target jaxspec/demo/target --text .gpu/data/gen --mask-token-id 1 \
  --init jaxspec/demo/drafter --grow-layers 2 --data greedy --prompt-len 64 --gen-new 192 --gen-batch 4096 \
  --sequences 65536 --batch 64 --anchors 16 --steps 80000 --lr 6e-4 --gamma 4 --ckpt-every 10000 --dtype bfloat16 \
  --seed 15 --time-budget-s 500 --out /tmp/run > /tmp/c/train.log 2>&1
echo "rc=$?" >> /tmp/c/train.log
