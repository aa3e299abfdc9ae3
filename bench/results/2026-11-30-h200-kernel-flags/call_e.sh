#!/bin/bash
# nvidia-h200, session 9, call E: the two opt-in kernels (gdn_decode, add_rms_norm) on the GPU for the first
# time: their kernel bench, the 64-layer AR round at 1K with each flag off/on (baseline twice), then their
# GPU tests and the engine's lossless GPU test with every kernel on.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/e; T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
trap '(cd /tmp/e && tar czf $OUT/e.tgz .); cat /tmp/e/e.log' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > /tmp/e/gpu.txt 2>&1
timeout 90 python -m pallas_kernels.gdn_decode.bench --json /tmp/e/gdn.json > /tmp/e/gdn.log 2>&1
echo "gdn bench rc=$? $(el)s $(tail -3 /tmp/e/gdn.log | tr '\n' ' ')" >> /tmp/e/e.log
run_ar() {  # name, gdn impl, add impl
  JAXSPEC_GDN_DECODE=$2 JAXSPEC_ADD_RMS_NORM=$3 timeout 80 python -m bench.tp --config real --tp 1 --contexts 1024 \
    --skip-identity --methods ar --out /tmp/e/ar_$1.json > /tmp/e/ar_$1.log 2>&1
  echo "$1 rc=$? $(el)s $(grep -o "ar_round {'median_ms': [0-9.]*" /tmp/e/ar_$1.log | tr '\n' ' ')" >> /tmp/e/e.log
}
run_ar ref1 reference reference
run_ar gdn pallas_triton reference
run_ar add reference pallas_triton
run_ar both pallas_triton pallas_triton
run_ar ref2 reference reference
JAX_PLATFORMS=cuda timeout $(( 560 - $(el) )) python -m pytest -q -m gpu tests/test_gdn_decode_kernel.py \
  tests/test_add_rms_norm_kernel.py tests/test_kernels_engine.py > /tmp/e/gpu_tests.log 2>&1
echo "gpu tests rc=$? $(el)s $(tail -1 /tmp/e/gpu_tests.log)" >> /tmp/e/e.log
