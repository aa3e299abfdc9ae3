#!/bin/bash
# The GPU test suite in parts that fit one device call (10 min). Session 40: the whole suite (168 tests) was cut by
# its 570 s timeout after 112; the opt-in skinny matmuls' 100 tests took most of it
# (bench/results/2026-12-04-h200-s40/README.md).
#   bash bench/next/gpu_tests.sh kernels    the kernels' own tests: tree and chain attention, tree delta rule, verify,
#                                           gdn_decode, gdn_tree_inputs, add_rms_norm, nucleus_mass
#                                           (~4.5 min before session 42)
#   bash bench/next/gpu_tests.sh engine     the engine with every kernel on (lossless against AR) and its loop
#                                           graphs (~3 min)
#   bash bench/next/gpu_tests.sh opt-in     the opt-in skinny matmuls (Triton 40, Mosaic GPU 60)
#   bash bench/next/gpu_tests.sh sharding   the TP tests (they need 2 and 4 GPUs: skipped on one)
# Writes $OUT/gpu-tests-PART.log with every test's name and verdict (-rA).
export PYTHONPATH=. JAX_PLATFORMS=cuda
case "$1" in
  kernels) FILES="tests/test_tree_attention_kernel.py tests/test_chain_attention.py tests/test_tree_delta_rule_kernel.py tests/test_chain_delta_rule.py
                  tests/test_verify_kernel.py
                  tests/test_gdn_tree_inputs_kernel.py
                  tests/test_gdn_decode_kernel.py tests/test_add_rms_norm_kernel.py tests/test_nucleus_mass_kernel.py";;
  engine) FILES="tests/test_kernels_engine.py tests/test_engine.py";;
  opt-in) FILES="tests/test_skinny_matmul_kernel.py tests/test_skinny_matmul_mosaic.py";;
  sharding) FILES="tests/test_sharding.py";;
  *) echo "usage: bash bench/next/gpu_tests.sh kernels | engine | opt-in | sharding"; exit 2;;
esac
OUT=${OUT:?set OUT to the folder for the log}
git log -1 --format='%h %s' > $OUT/gpu-tests-$1.log
timeout 560 python -m pytest -q -rA -m gpu $FILES -p no:cacheprovider --durations=10 >> $OUT/gpu-tests-$1.log 2>&1
echo "rc=$?" >> $OUT/gpu-tests-$1.log
tail -15 $OUT/gpu-tests-$1.log
