#!/bin/bash
# nvidia-h200, session 8, call D: DDTree(64) round at 64 layers, 1K: XLA tree delta rule vs the Pallas one;
# then the chunked-prefill GPU test of the Pallas tree delta rule.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/d; T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
trap '(cd /tmp/d && tar czf $OUT/d.tgz .); cat /tmp/d/d.log' EXIT
for impl in xla pallas_triton; do
  JAXSPEC_TREE_DELTA_RULE=$impl timeout 150 python -m bench.tp --config real --tp 1 --contexts 1024 --skip-identity \
    --methods ddtree64,dflash --out /tmp/d/ddtree_$impl.json > /tmp/d/ddtree_$impl.log 2>&1
  echo "$impl rc=$? $(el)s $(grep -o "[a-z0-9]*_round {'median_ms': [0-9.]*" /tmp/d/ddtree_$impl.log | tr '\n' ' ')" >> /tmp/d/d.log
done
JAX_PLATFORMS=cuda timeout $(( 440 - $(el) )) python -m pytest -q -m gpu tests/test_tree_delta_rule_kernel.py -k chunked_prefill \
  > /tmp/d/chunked_prefill_test.log 2>&1
echo "chunked prefill test rc=$? $(el)s $(tail -1 /tmp/d/chunked_prefill_test.log)" >> /tmp/d/d.log
