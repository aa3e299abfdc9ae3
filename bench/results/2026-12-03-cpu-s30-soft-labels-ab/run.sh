# CPU A/B of --soft-labels: a fresh 1-layer drafter for the shipped demo target, the same data, seed and steps in each arm.
cd /work/main
export PYTHONPATH=. PYTHONUNBUFFERED=1
FILES=$(.venv/bin/python -c "
from jaxspec import train
print(' '.join(map(str, train.split_files(train.stdlib_files(), unseen=True)[2])))")
for a in 0 0.5 1; do
  /usr/bin/time -f "wall %e s" .venv/bin/python -m jaxspec.train drafter --target jaxspec/demo/target --text $FILES \
    --package-text 200 --mask-token-id 1 --data greedy --features live --sequences 1088 --gen-batch 64 \
    --val-sequences 64 --layers 1 --batch 8 --anchors 16 --steps 400 --lr 1e-3 --gamma 4 --dtype float32 \
    --seed 7 --soft-labels $a --out /tmp/ab/soft$a > /tmp/ab/soft$a.log 2>&1
  echo "rc=$?" >> /tmp/ab/soft$a.log
done
