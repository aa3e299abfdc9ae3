#!/bin/bash
# Next GPU session, #6 (nvidia-h200, one call, <= 9.5 min): the engine's GPU lossless test, then the plan's
# items 1 and 3 in one start.
# 1. The tree build alone at B = 31, 32, 63, 64, as the engine runs it ("plain") and with the counted top-k's
#    input materialised ("materialized"), each with its 14 longest kernels and its optimised HLO (~1-2 min).
#    Prediction (bench/tree_build.py's docstring): materialized brings B = 63 from 0.69 to <= 0.47 ms of device
#    time and B = 31 to <= 0.43, and leaves B = 64 / 32 unchanged. Refuted if B = 63 stays above 0.6 ms.
# 2. Issue #6's whole table at 1K / 32K / 128K, budget 63, now with the verify and delta_rule parts (their
#    kernels alone at the real shape, against a copy in the same process; CPU-tested only until now). Predictions:
#    the rows of session 14 (bench/results/2026-12-01-h200-s14-table) within 2%; the verify kernel reads the 64
#    rows' 63.6 MB of fp32 logits once, at >= 50% of copy (never measured alone); the tree delta rule kernel at
#    16 / 64 nodes 20-40 us a layer (session 10's sweep: 30.7 at 65 nodes).
# 3. (in 2's rows) session 15's narrow accepted path (Tree.max_depth, 7a71a2f): commit moves and folds into the
#    GDN state, and the drafter takes as context, at most 16 rows of a 64-node tree instead of 64. On a CPU the
#    GDN fold at the real shape went 165 -> 103 ms a call, bit-identical (bench/results/
#    2026-12-01-cpu-commit-path-nodes). Prediction: tree build + accept + commit 1.35 -> 1.15-1.25 ms of
#    device time at 1K, the DDTree(63) round -0.1 to -0.25 ms; the DFlash round unchanged (a chain).
# JAXSPEC_COMMIT=<hash> [LIMIT=580] bash bench/next/k_table.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kt; mkdir -p $W
trap '(cd $W && tar czf $OUT/kt.tgz .); grep -h "rc=\|tree_build B=\|passed\|failed" $W/*.log | tail -14; cat $W/t/table.md 2>/dev/null' EXIT
T0=$(date +%s); at() { echo $(( $(date +%s) - T0 )); }
# 0. The engine with every kernel on stays token-identical to AR (oracle drafters that get accepted), now that
#    accept / commit / the drafter's update take the narrow path (~60 s at d41b256).
timeout 120 python -m pytest -q -m gpu tests/test_kernels_engine.py > $W/gpu_tests.log 2>&1
echo "gpu tests rc=$? at $(at)" >> $W/gpu_tests.log
timeout 150 python -m bench.tree_build --budgets 31,32,63,64 --variants plain,materialized --kernels 14 \
  --hlo-dir $W/hlo --out $W/tree_build.json > $W/tree_build.log 2>&1
echo "tree_build rc=$? at $(at)" >> $W/tree_build.log
timeout $(( ${LIMIT:-580} - $(at) )) python -m bench.table --config real --contexts 1024,32768,131072 --budget 63 \
  --deadline-s $(( ${LIMIT:-580} - 25 - $(at) )) --out $W/t > $W/table.log 2>&1
echo "table rc=$? at $(at)" >> $W/table.log
