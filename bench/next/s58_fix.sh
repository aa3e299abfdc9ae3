#!/bin/bash
# Session 58, #6: the DDTree(63) round at 1K took 28.92 ms with a 137K-slot cache (H100, 3-context table) against
# 26.66 with a ~39K one (session 57): ~2.2 ms a round more, what one copy of the 16 layers' K and V (64 KiB a slot)
# takes at the H100's copy rate. Suspect: commit's move gathers tree rows from the cache and scatters them back, XLA
# fuses the gather into the scatter, and a fusion that reads its own in-place operand gets a copy of it.
# The fix (jaxspec/model.py, commit): an optimization barrier on the gathered rows. Both versions' optimized round
# loop grep'd for copies of cache-shaped buffers, and the rounds timed (loop graphs on) at 1K and 128K.
# The new test (tests/test_target.py -k in_place) on the GPU with each version: predicted to pass, then fail.
# bench/next/s58_model_before.py was `git show bf7530b:jaxspec/model.py` (removed after the call).
# Predicted: the old module has 32 cache copies (16 layers x K, V) and the new none; DDTree(63) at 1K 26.5-26.9 ms
# (28.92 before), at 128K ~37.9 (40.13).
#   OUT=... bash bench/next/s58_fix.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
grep_copies() {   # $1: dump dir, $2: label
  f=$(ls -S $1/*run_rounds*after_optimizations.txt | head -1)
  { echo "== $2 $(basename $f) $(stat -c %s $f) bytes"
    echo "copies of 137292-slot buffers: $(grep -c '137292[^ ]* copy\(-start\)\?(' $f)"
    grep -E '137292[^ ]* (copy|copy-start)\(' $f | cut -c1-300 | head -8
    echo "scatter fusions of 137292-slot buffers: $(grep -cE '137292[^ ]* fusion\(.*scatter' $f)"
  } >> $OUT/hlo-copies.txt
}
python -m pytest -q -p no:cacheprovider tests/test_target.py -k in_place -m "gpu or not gpu" > $OUT/test-fixed.log 2>&1
echo "in-place test, fixed: $(tail -1 $OUT/test-fixed.log)"
D1=$(mktemp -d)
XLA_FLAGS="--xla_dump_to=$D1 --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*run_rounds.*" timeout 280 \
  python -m bench.rounds --config real --context 1024,131072 --phases ddtree --rounds-only --round-budget 63 \
  --out $OUT/rounds-fixed.json > $OUT/rounds-fixed.log 2>&1
echo "fixed rc=$?"; grep "ddtree63_round\|ar_step " $OUT/rounds-fixed.log | cut -c1-200; grep_copies $D1 fixed
cp bench/next/s58_model_before.py jaxspec/model.py
python -m pytest -q -p no:cacheprovider tests/test_target.py -k in_place -m "gpu or not gpu" > $OUT/test-before.log 2>&1
echo "in-place test, before (predicted: fails, copies named): $(tail -1 $OUT/test-before.log)"
grep "copy(" $OUT/test-before.log | head -4
D2=$(mktemp -d)
XLA_FLAGS="--xla_dump_to=$D2 --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*run_rounds.*" timeout 200 \
  python -m bench.rounds --config real --context 1024 --max-len 137292 --phases ddtree --rounds-only \
  --round-budget 63 --out $OUT/rounds-before.json > $OUT/rounds-before.log 2>&1
echo "before rc=$?"; grep "ddtree63_round\|ar_step " $OUT/rounds-before.log | cut -c1-200; grep_copies $D2 before
cat $OUT/hlo-copies.txt
