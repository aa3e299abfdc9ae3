#!/bin/bash
# nvidia-h200, session 12, call K2 (warm after call KN, same checkout e644dac): the 8K prefill that KN's table
# cut at its deadline, then the tree attention's GPU tests again with a longer limit (KN's 150 s ran 17 of 18).
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAXSPEC_COMMIT=e644dac; mkdir -p /tmp/k2
trap '(cd /tmp/k2 && tar czf $OUT/k2.tgz .); tail -3 /tmp/k2/ta.log; tail -3 /tmp/k2/prefill.log' EXIT
JAX_PLATFORMS=cuda timeout 100 python -m bench.harness --config real --dtype bfloat16 --contexts "" --prompt 8192 \
  --prefill-iters 3 --ceiling-iters 10 --out /tmp/k2/harness.json > /tmp/k2/prefill.log 2>&1
echo "prefill rc=$?" >> /tmp/k2/prefill.log
JAX_PLATFORMS=cuda timeout 280 python -m pytest -q -m gpu tests/test_tree_attention_kernel.py -rA --durations=0 > /tmp/k2/ta.log 2>&1
echo "ta rc=$?" >> /tmp/k2/ta.log
