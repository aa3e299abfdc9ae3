#!/bin/bash
# #8 (nvidia-h200, one call, <= 9.5 min): the shipped pair's wall-clock speedups on the H200, on the 16 and the 48
# held-out prompts of the CPU evaluations (session 22's lists name the CPU host's pyenv 3.12.1 stdlib; here they
# are mapped to the image's /usr/lib/python3.12, and files the image lacks are listed in missing-*.txt).
# Predicted: tau as on the CPU (2.20 / 2.10 DFlash) give or take the prompts that differ; speedups below 1x
# (session 14's pair: DFlash 0.87x, DDTree(64) 0.73x; a tiny target's step is launch-bound, so a round of
# verify + drafter costs more than tau AR steps).
# JAXSPEC_COMMIT=<hash> bash bench/next/d_eval.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/de; mkdir -p $W
trap 'cp $W/*.json $W/*.txt $W/*.log $OUT/ 2>/dev/null; grep -h "tau\|speedup\|rc=" $W/*.log | tail -30' EXIT
for set in 16:s22-pair-share08:4:16 48:s19-pair-wide-prompts:5:48; do
  IFS=: read n dir seed prompts <<< "$set"
  sed 's#^/root/.pyenv/versions/3.12.1/lib/python3.12/#/usr/lib/python3.12/#' \
    bench/results/2026-12-01-h200-$dir/eval-$n-files.txt > $W/files-$n.txt
  : > $W/missing-$n.txt; : > $W/present-$n.txt
  while read f; do [ -f "$f" ] && echo "$f" >> $W/present-$n.txt || echo "$f" >> $W/missing-$n.txt; done < $W/files-$n.txt
  timeout 270 python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
    --text $(cat $W/present-$n.txt) --prompts $prompts --seed $seed --out $W/gpu-eval-$n.json > $W/eval-$n.log 2>&1
  echo "eval $n rc=$? missing $(wc -l < $W/missing-$n.txt) of $(wc -l < $W/files-$n.txt)" >> $W/eval-$n.log
done
