#!/bin/bash
# Next GPU session, #8 (nvidia-h200, one call, ~6 min): the shipped pair's DDTree(64) on the H200, which session 23's
# evaluation (bench/results/2026-12-02-h200-s23-peel-graphs-eval/eval) did not reach before its limits. AR runs
# too, as the speedup's baseline. JAX's persistent compilation cache is on, so the second set reuses programs the
# first one compiled.
# Predicted: tau 3.29 (16 prompts) / 3.09 (48), as on the CPU; speedup 0.7-0.9x (DDTree(32): 0.95x / 0.81x).
# First, on the CPU host (the held-out files are idlelib / turtledemo / tkinter sources, which the image lacks):
#   bash bench/next/d_eval64.sh --prepare      # copies them into the untracked evaltext/, which travels
# then: JAXSPEC_COMMIT=<hash> bash bench/next/d_eval64.sh
if [ "$1" = --prepare ]; then
  rm -rf evaltext && mkdir evaltext || exit 1
  for set in 16:s22-pair-share08 48:s19-pair-wide-prompts; do
    IFS=: read n dir <<< "$set"
    while read f; do
      r=${f#/root/.pyenv/versions/3.12.1/lib/python3.12/}
      mkdir -p evaltext/$(dirname $r) && cp "$f" evaltext/$r && echo evaltext/$r
    done < bench/results/2026-12-01-h200-$dir/eval-$n-files.txt > evaltext.list && mv evaltext.list evaltext/list-$n.txt
  done
  wc -l evaltext/list-*.txt; exit 0
fi
[ -f evaltext/list-16.txt ] || { echo "no evaltext/: run bash bench/next/d_eval64.sh --prepare on the CPU host first"; exit 1; }
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/de; mkdir -p $W
trap 'cp $W/*.json $W/*.log $OUT/ 2>/dev/null; grep -h "tau\|speedup\|rc=" $W/*.log | tail -30' EXIT
for set in 16:4:16:280 48:5:48:280; do
  IFS=: read n seed prompts limit <<< "$set"
  timeout $limit python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
    --text $(cat evaltext/list-$n.txt) --prompts $prompts --seed $seed --budgets 64 --out $W/gpu-eval-$n.json \
    > $W/eval-$n.log 2>&1
  echo "eval $n rc=$?" >> $W/eval-$n.log
done
