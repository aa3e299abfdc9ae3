#!/bin/bash
# Next GPU session, #6 (nvidia-h200, one call, ~5 min): what a DDTree round costs at budgets that fit the tree
# delta rule's 16-row tiles. A budget of B verifies B + 1 nodes (the root and B). Session 23
# (bench/results/2026-12-02-h200-s23-peel-graphs-eval) profiled verify at 21.12 ms for 64 nodes against 22.27 for 65:
# the 65th node makes the kernels run 80 rows (+1.1 ms in the tree delta rule) and XLA switch the MLP to other
# cuBLAS kernels.
# This call times whole DDTree rounds (4 calls of 10 rounds queued, real 27B shapes, random bf16 weights, 1K
# context) at budgets 63 (64 nodes), 64 (65, today's default), 79 (80) and 95 (96), in one process (`--round-budget 64,63,79,95`, ~5 min).
# Predicted: round(63) 1.0-1.3 ms under round(64) (25.53 ms queued in session 23); round(79) within 0.5 ms of
# round(64), because 65 nodes already pay for 80 rows in the tree delta rule; round(95) 0.8-1.5 ms over round(64).
# The CPU side: tau of the shipped pair at budgets 63 / 64 / 79 / 95 on the 16 held-out prompts
# (bench/results/2026-12-02-cpu-s23-budgets/). Which budget is the default then follows from tau / round time.
# JAXSPEC_COMMIT=<hash> bash bench/next/k_tiles.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kt; mkdir -p $W
trap '(cd $W && tar czf $OUT/kt.tgz .); grep -h "rc=\|_round {" $W/*.log' EXIT
timeout 560 python -m bench.rounds --config real --context 1024 --phases ddtree --rounds-only \
  --round-budget 64,63,79,95 --out $W/budgets.json > $W/budgets.log 2>&1
echo "budgets rc=$?" >> $W/budgets.log
