#!/bin/bash
# Session 64's fourth call: whatever card comes. On an H200, #6's table (bench/next/table.sh, the plan's item 1,
# owed since session 60) with a 480 s deadline for the budget left. On an H100 (which already ran the table this
# session, call 1): the engine's and the chain op's GPU tests at HEAD (4438c06's single resolve has run only
# inside call 3's tree), then the chain state pass's variants (bench/next/k_chain_pass.py; 16 columns on 2 warps
# was 15.5% and 9.5% faster than the default in session 63's two H100 leases, a third lease decides).
#   OUT=... bash bench/next/s64d.sh      (-> $OUT/table.tgz on an H200, $OUT/s64d.tgz on an H100)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "card: $GPU"
case "$GPU" in
  *H200*) exec bash bench/next/table.sh --deadline-s 480;;
esac
W=$(mktemp -d)
trap 'tar czf $OUT/s64d.tgz -C $W .' EXIT
echo "$GPU" > $W/gpu.txt
timeout 330 python -m pytest -q -rA -m gpu tests/test_kernels_engine.py tests/test_engine.py \
  tests/test_chain_attention.py -p no:cacheprovider --durations=10 > $W/gpu-tests.log 2>&1
echo "tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)" $W/gpu-tests.log | cut -c1-150; tail -1 $W/gpu-tests.log
timeout 150 python bench/next/k_chain_pass.py $W/chain_pass.json > $W/chain_pass.log 2>&1
echo "pass rc=$?"; grep -v "^WARNING" $W/chain_pass.log | cut -c1-160 | tail -12
