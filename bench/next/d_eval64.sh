#!/bin/bash
# #8 (nvidia-h200, one call, ~6 min): the demo pair (jaxspec/demo) on the H200, DDTree at $BUDGETS (default 64) and
# DFlash, with AR as the speedup's baseline. JAX's persistent compilation cache is on, so the second set reuses
# programs the first one compiled. Session 24 ran it on the previous pair: tau equal to the CPU's, DDTree(64)
# 0.73x / 0.71x AR (bench/results/2026-12-02-h200-s24-tiles-eval64/eval/).
# Session 30's pair (s25 target, 6-layer drafter), predicted: tau as on the CPU (DFlash 2.84 / 2.35, DDTree(64)
# 4.13 / 3.41 on the 16 / 48 prompts); DDTree(64) 0.85-1.0x AR (the tau gain of 1.26x against ~2 more drafter
# layers' launches a round).
# The tree is over the device's 64 MiB with jaxspec/demo and bench/results both in it: run
#   bash bench/next/slim.sh on jaxspec/demo      (and `bash bench/next/slim.sh off` afterwards)
# First, on the CPU host (the held-out files are idlelib / turtledemo / tkinter sources, which the image lacks):
#   bash bench/next/d_eval64.sh --prepare      # copies them into the untracked evaltext/, which travels
# then: JAXSPEC_COMMIT=<hash> [BUDGETS="16 32 64"] [SETS="16 48"] [GRAPHS="ar"] bash bench/next/d_eval64.sh
# EXTRA: more `eval` flags (e.g. EXTRA="--dtype bfloat16" TAG=-bf16; TAG is added to the output names).
# GRAPHS: the JAXSPEC_LOOP_GRAPHS modes to run each set with, in turn (outputs gpu-eval-<set>-<mode>.json); session 31
# made `ar` the default, which speeds the AR baseline of a launch-bound small pair as well as the 27B one.
# Session 31's plan for the next GPU session: SETS=16 GRAPHS="ar all". Predicted: with `ar`, AR 10-30% more tok/s
# than session 31's 2819 (its run had no graphs), so the speedups fall below 0.87x / 0.84x; with `all`, the DFlash and
# DDTree(64) rounds as much shorter, the speedups back to >= 0.87x / 0.84x. `all` becomes the default for a pair this
# small only if both speculative methods gain against `ar`.
# Session 34's plan (bench/NOTES.md): the shipped pair (session 34's drafter) with its drafter in fp32 and in bf16 under
# the fp32 target, `for t in float32 bfloat16; do SETS="16 48" EXTRA="--draft-dtype $t" TAG=-draft$t bash ...; done`.
# Predicted: with the bf16 drafter the DFlash round 1.08 -> 0.85-0.95 ms, DFlash 1.03-1.15x AR, identical to AR.
# Session 35 ran it (bench/results/2026-12-03-h200-s35/): bf16 drafter DFlash 1.13x AR on 16, 0.95x on 48; fp32 drafter
# 0.91x on 16. Since ff3d2b8 `eval` puts the drafter in bf16 on a GPU under a fp32 target: EXTRA="--draft-dtype float32"
# for the earlier runs' setting.
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
for mode in ${GRAPHS:-ar}; do
for set in 16:4:16:330 48:5:48:250; do     # session 24: the 16 set cold ran past 280 s; warm, 66 s
  IFS=: read n seed prompts limit <<< "$set"
  [[ " ${SETS:-16 48} " == *" $n "* ]] || continue
  JAXSPEC_LOOP_GRAPHS=$mode timeout $limit python -m jaxspec.train eval --target jaxspec/demo/target \
    --draft jaxspec/demo/drafter --text $(cat evaltext/list-$n.txt) --prompts $prompts --seed $seed \
    --budgets ${BUDGETS:-64} $EXTRA --out $W/gpu-eval-$n-$mode$TAG.json > $W/eval-$n-$mode$TAG.log 2>&1
  echo "eval $n $mode$TAG rc=$?" >> $W/eval-$n-$mode$TAG.log
done
done
