#!/bin/bash
# Next GPU session, #6 (nvidia-h200, ~8 min): the DDTree tree build at B = 63 and 64 alone (session 12 timed
# 0.70 ms at 63 against session 11's 0.47 at 64, unexplained), then issue #6's whole table (rounds, tree
# attention at 128K, 8K prefill) at 1K, 32K and 128K with budget 63, now with the drafter's full layer on the
# tree-attention kernel (ce11865), and bench.rounds now donating the drafter's cache as the engine does (an
# undonated one was copied whole for the block's scratch rows, ~0.2 ms at 137K slots). Predictions: drafter step
# 2.01 -> ~1.8 / ~1.9 / ~1.95 ms of kernels; DFlash round
# 19.29 / ~20.5 / 23.51 ms (bench/results/2026-11-30-h200-s12-drafter-kernel); the rest as in session 12's table.
# JAXSPEC_COMMIT=<hash> [LIMIT=585] bash bench/next/k_next.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/kn
trap '(cd /tmp/kn && tar czf $OUT/kn.tgz .); grep -h "rc=\|tree_build" /tmp/kn/*.log | tail; cat /tmp/kn/t/table.md 2>/dev/null' EXIT
T0=$(date +%s); at() { echo $(( $(date +%s) - T0 )); }
JAX_PLATFORMS=cuda timeout 120 python -m bench.rounds --config real --context 1024 --phases ddtree --budgets 63,64 \
  --round-budget 63 --k 20 --rounds 10 --out /tmp/kn/build.json > /tmp/kn/build.log 2>&1
echo "build rc=$? at $(at)" >> /tmp/kn/build.log
JAX_PLATFORMS=cuda timeout $(( ${LIMIT:-585} - $(at) )) python -m bench.table --config real --contexts 1024,32768,131072 --budget 63 \
  --deadline-s $(( ${LIMIT:-585} - 25 - $(at) )) --out /tmp/kn/t > /tmp/kn/table.log 2>&1
echo "table rc=$? at $(at)" >> /tmp/kn/table.log
