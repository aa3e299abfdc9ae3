#!/bin/bash
# nvidia-h200, session 11, call K2 (#6): the 64-layer 1K rounds with the counted top-k as the GPU default;
# XLA's skinny products across row counts (is 65 rows a cliff?); the skinny matmul's GPU tests after the smem fix.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/k2
trap '(cd /tmp/k2 && tar czf $OUT/k2.tgz .); grep -h "rc=\|passed\|failed" /tmp/k2/*.log | head; grep -h "xla" /tmp/k2/rows.log; cat /tmp/k2/t/table.md 2>/dev/null' EXIT
T0=$(date +%s); at() { echo $(( $(date +%s) - T0 )); }
JAX_PLATFORMS=cuda timeout 75 python -m pytest -q -m gpu tests/test_skinny_matmul_kernel.py > /tmp/k2/tests.log 2>&1
echo "tests rc=$? at $(at)" >> /tmp/k2/tests.log
JAX_PLATFORMS=cuda timeout 100 python -m pallas_kernels.skinny_matmul.bench --rows 16,32,64,65,96,128 \
  --shapes mlp.gate_proj,mlp.down_proj --json /tmp/k2/rows.json > /tmp/k2/rows.log 2>&1
echo "rows rc=$? at $(at)" >> /tmp/k2/rows.log
JAX_PLATFORMS=cuda timeout $(( 585 - $(at) )) python -m bench.table --config real --contexts 1024 --parts rounds \
  --deadline-s $(( 560 - $(at) )) --out /tmp/k2/t > /tmp/k2/table.log 2>&1; echo "table rc=$? at $(at)" >> /tmp/k2/table.log
