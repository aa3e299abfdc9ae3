#!/bin/bash
# nvidia-h200, session 11, call K3 (#6): DDTree with 63 draft nodes (a 64-row verify, below XLA's 65-row cliff)
# against 64, at 16 and 64 layers; the skinny matmul's fp32 k_proj case after the smem fix; tree attention's tile
# sweep at a 128K prefix; the tree delta rule's tf32x3 rows at N = 65.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/k3
trap '(cd /tmp/k3 && tar czf $OUT/k3.tgz .); grep -h "rc=\|passed\|failed\|_round {" /tmp/k3/*.log' EXIT
T0=$(date +%s); at() { echo $(( $(date +%s) - T0 )); }
JAX_PLATFORMS=cuda timeout 60 python -m pytest -q -m gpu tests/test_skinny_matmul_kernel.py -k "k_proj" > /tmp/k3/tests.log 2>&1
echo "tests rc=$? at $(at)" >> /tmp/k3/tests.log
tp() {  # $1 tag, $2 layers (0: all), $3 budget
  JAX_PLATFORMS=cuda timeout $4 python -m bench.tp --config real --tp 1 --layers $2 --contexts 1024 --budget $3 \
    --skip-identity --methods ddtree$3 --rounds 16 --out /tmp/k3/tp_$1.json > /tmp/k3/tp_$1.log 2>&1
  echo "tp $1 rc=$? at $(at)" >> /tmp/k3/tp_$1.log
}
tp l16_b64 16 64 90
tp l16_b63 16 63 90
tp l64_b63 0 63 200
if [ $(( 560 - $(at) )) -gt 60 ]; then
  JAX_PLATFORMS=cuda timeout $(( 560 - $(at) )) python -m pallas_kernels.tree_attention.bench --prefixes 131072 --sizes 65 \
    --no-reference --sweep --json /tmp/k3/ta.json > /tmp/k3/ta.log 2>&1; echo "ta rc=$? at $(at)" >> /tmp/k3/ta.log
fi
