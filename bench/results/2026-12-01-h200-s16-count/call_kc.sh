#!/bin/bash
# Session 16's last GPU call (nvidia-h200, one call, <= 9.5 min): the counted top-k's running count without
# XLA's cumsum (ddtree.running_count), and the anc_row tidy in model.commit.
# Why: in session 16's first call (bench/results/2026-12-01-h200-s16-table) the tree build at B = 63 took
# 0.687 ms of device time against 0.469 at B = 64. The kernels say why: the cumsum in counted_top_k_set over
# 63 x 63 = 3969 candidates became one small loop kernel that fuses two 16-wide reduce-window levels
# (256 threads, ~256 loads each): 135 us for 14 calls a tree; over 4096 candidates XLA splits the levels
# (18 us). B = 31 / 32 (961 / 1024 candidates) have the same fused kernel: 87 / 78 us.
# Predictions (device time, bench.tree_build, plain): B = 63 0.687 -> 0.55-0.60 ms; B = 31 0.468 -> 0.38-0.42;
# B = 32 0.435 -> 0.36-0.40; B = 64 0.469 -> 0.44-0.48 (unchanged within 0.03). In the table at 1K: tree
# build (B = 63) + accept + commit 1.17 -> 1.04-1.09 ms; DDTree(63) round 23.84 -> 23.7-23.8 ms; the other
# rows of session 16's first call within 2%. Refuted if B = 63 stays above 0.65 ms.
# JAXSPEC_COMMIT=<hash> [LIMIT=560] bash bench/next/k_count.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kc; mkdir -p $W
trap '(cd $W && tar czf $OUT/kc.tgz .); grep -h "rc=\|tree_build B=\|passed\|failed" $W/*.log | tail -16; cat $W/t/table.md 2>/dev/null' EXIT
T0=$(date +%s); at() { echo $(( $(date +%s) - T0 )); }
# 0. The counted selections on the GPU (where count is the default) and the engine with every kernel on,
#    token-identical to AR with oracle drafters that get accepted.
timeout 200 python -m pytest -q tests/test_ddtree.py -k "running_count or counted or count_" \
  > $W/gpu_count_tests.log 2>&1; echo "count tests rc=$? at $(at)" >> $W/gpu_count_tests.log
timeout 150 python -m pytest -q -m gpu tests/test_kernels_engine.py > $W/gpu_engine_test.log 2>&1
echo "engine test rc=$? at $(at)" >> $W/gpu_engine_test.log
timeout 100 python -m bench.tree_build --budgets 31,32,63,64 --variants plain --kernels 14 \
  --out $W/tree_build.json > $W/tree_build.log 2>&1
echo "tree_build rc=$? at $(at)" >> $W/tree_build.log
timeout $(( ${LIMIT:-560} - $(at) )) python -m bench.table --config real --contexts 1024,32768,131072 --budget 63 \
  --deadline-s $(( ${LIMIT:-560} - 20 - $(at) )) --out $W/t > $W/table.log 2>&1
echo "table rc=$? at $(at)" >> $W/table.log
