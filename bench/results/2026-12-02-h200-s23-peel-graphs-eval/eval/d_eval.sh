#!/bin/bash
# #8 (nvidia-h200, one call, <= 9.5 min): the shipped pair's wall-clock speedups on the H200, on the 16 and the 48
# held-out prompts of the CPU evaluations. Their files are ones the image lacks (idlelib, turtledemo, tkinter: that
# is why no pair trained on the image saw them), so they travel in the working tree as the untracked evaltext/
# (copies of the CPU host's pyenv 3.12.1 stdlib files, listed in evaltext/list-{16,48}.txt).
# Predicted: tau as on the CPU (2.20 / 2.10 DFlash) give or take the prompts that differ; speedups below 1x
# (session 14's pair: DFlash 0.87x, DDTree(64) 0.73x; a tiny target's step is launch-bound, so a round of
# verify + drafter costs more than tau AR steps).
# JAXSPEC_COMMIT=<hash> bash bench/next/d_eval.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/de; mkdir -p $W
trap 'cp $W/*.json $W/*.log $OUT/ 2>/dev/null; grep -h "tau\|speedup\|rc=" $W/*.log | tail -30' EXIT
for set in 16:4:16:300 48:5:48:270; do
  IFS=: read n seed prompts limit <<< "$set"
  timeout $limit python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
    --text $(cat evaltext/list-$n.txt) --prompts $prompts --seed $seed --out $W/gpu-eval-$n.json > $W/eval-$n.log 2>&1
  echo "eval $n rc=$?" >> $W/eval-$n.log
done
