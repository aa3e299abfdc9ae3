#!/bin/bash
# Next GPU session, #6 (nvidia-h200, ~9 min): the tree attention's new default tiles (64 x 32, 4 warps) under its
# GPU tests; then issue #6's whole table (rounds, tree attention at 128K, 8K prefill) at
# 1K, 32K and 128K with budget 63 (tree attention dominates at 128K: predicted ~-11 ms on verify(64) there; the
# one-contraction GDN commit (6f1cbac): tree build + accept + commit 1.32 -> ~0.9 ms of kernels at 1K).
# JAXSPEC_COMMIT=<hash> bash bench/next/k_next.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/kn
trap '(cd /tmp/kn && tar czf $OUT/kn.tgz .); grep -h "rc=\|passed\|failed" /tmp/kn/*.log; cat /tmp/kn/t/table.md 2>/dev/null' EXIT
T0=$(date +%s); at() { echo $(( $(date +%s) - T0 )); }
JAX_PLATFORMS=cuda timeout 150 python -m pytest -q -m gpu tests/test_tree_attention_kernel.py > /tmp/kn/ta_tests.log 2>&1
echo "ta tests rc=$? at $(at)" >> /tmp/kn/ta_tests.log
JAX_PLATFORMS=cuda timeout $(( ${LIMIT:-585} - $(at) )) python -m bench.table --config real --contexts 1024,32768,131072 --budget 63 \
  --deadline-s $(( ${LIMIT:-585} - 25 - $(at) )) --out /tmp/kn/t > /tmp/kn/table.log 2>&1
echo "table rc=$? at $(at)" >> /tmp/kn/table.log
