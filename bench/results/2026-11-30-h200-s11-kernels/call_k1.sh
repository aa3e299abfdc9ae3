#!/bin/bash
# nvidia-h200, session 11, call K1 (#6): the skinny matmul and the sort-free tree build on the GPU for the first time.
# GPU tests, the kernel bench at the real projections, 16-layer device-loop rounds with each flag, the engine's
# lossless GPU test with the skinny matmul, then a tile sweep if time remains.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/k
trap '(cd /tmp/k && tar czf $OUT/k.tgz .); grep -h "rc=\|passed\|failed\|error" /tmp/k/*.log | head -40; grep -h "TB/s" /tmp/k/bench.log | head -30' EXIT
T0=$(date +%s); left() { echo $(( ${1} - ($(date +%s) - T0) )); }
JAX_PLATFORMS=cuda timeout 150 python -m pytest -q -x -m gpu tests/test_skinny_matmul_kernel.py > /tmp/k/tests.log 2>&1
echo "tests rc=$? at $(left 0)" >> /tmp/k/tests.log
JAX_PLATFORMS=cuda timeout 90 python -m pallas_kernels.skinny_matmul.bench --rows 16,65 --json /tmp/k/bench.json > /tmp/k/bench.log 2>&1
echo "bench rc=$? at $(left 0)" >> /tmp/k/bench.log
tp16() {  # $1 tag, $2 methods, rest: env
  local tag=$1 methods=$2; shift 2
  env "$@" JAX_PLATFORMS=cuda timeout 110 python -m bench.tp --config real --tp 1 --layers 16 --contexts 1024 \
    --skip-identity --methods $methods --rounds 16 --out /tmp/k/tp16_$tag.json > /tmp/k/tp16_$tag.log 2>&1
  echo "tp16 $tag [$*] rc=$? at $(left 0)" >> /tmp/k/tp16_$tag.log
}
tp16 plain ar,dflash,ddtree64
tp16 skinny dflash,ddtree64 JAXSPEC_SKINNY_MATMUL=pallas_triton
tp16 count ddtree64 JAXSPEC_DDTREE_TOP_K=count
if [ $(left 480) -gt 100 ]; then
  JAX_PLATFORMS=cuda JAXSPEC_SKINNY_MATMUL=pallas_triton timeout $(left 560) python -m pytest -q -m gpu \
    tests/test_kernels_engine.py > /tmp/k/engine.log 2>&1; echo "engine rc=$? at $(left 0)" >> /tmp/k/engine.log
fi
if [ $(left 560) -gt 40 ]; then
  JAX_PLATFORMS=cuda timeout $(left 575) python -m pallas_kernels.skinny_matmul.bench --rows 16,65 --shapes mlp.gate_proj,mlp.down_proj \
    --sweep --json /tmp/k/sweep.json > /tmp/k/sweep.log 2>&1; echo "sweep rc=$? at $(left 0)" >> /tmp/k/sweep.log
fi
