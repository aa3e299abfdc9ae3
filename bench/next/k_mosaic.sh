#!/bin/bash
# Next GPU session, #6 (nvidia-h200, <= 9.5 min): the skinny matmul's Mosaic GPU kernel (pallas_kernels/skinny_matmul/
# pallas_mosaic.py, session 12; interpreter-tested on the CPU only) compiled for the first time: its GPU tests at
# every real projection shape (16, 64, 65 rows), then timed alone against XLA at four projection shapes, and with
# its tile sweep on the MLP's gate (both forms of the product: x @ w on 64-row tiles, and w^T @ x^T on rows padded to 16).
# Prediction: it compiles, and streams >= 3.3 TB/s at 64 and 65 rows (XLA: 3.12 and 2.50) and
# ~3.5 at 16 (XLA 3.57). If it beats XLA at 64/65 rows, the next step is the 16-layer rounds with
# JAXSPEC_SKINNY_MATMUL=pallas_mosaic (bench.tp --layers 16), then the engine's lossless GPU test with it.
# JAXSPEC_COMMIT=<hash> bash bench/next/k_mosaic.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/km
trap '(cd /tmp/km && tar czf $OUT/km.tgz .); tail -3 /tmp/km/tests.log; grep -h "TB/s\|failed\|rc=" /tmp/km/bench.log /tmp/km/sweep.log | tail -60' EXIT
JAX_PLATFORMS=cuda timeout 240 python -m pytest -q -m gpu tests/test_skinny_matmul_mosaic.py -rA > /tmp/km/tests.log 2>&1
echo "tests rc=$?" >> /tmp/km/tests.log
JAX_PLATFORMS=cuda timeout 100 python -m pallas_kernels.skinny_matmul.bench --rows 16,64,65 \
  --shapes mlp.down_proj,attn.k_proj,gdn.in_proj_qkv,attn.o_proj --impls xla,pallas_mosaic --json /tmp/km/mm.json > /tmp/km/bench.log 2>&1
echo "bench rc=$?" >> /tmp/km/bench.log
JAX_PLATFORMS=cuda timeout 220 python -m pallas_kernels.skinny_matmul.bench --rows 16,64,65 \
  --shapes mlp.gate_proj --impls xla,pallas_mosaic --sweep --json /tmp/km/sweep.json > /tmp/km/sweep.log 2>&1
echo "sweep rc=$?" >> /tmp/km/sweep.log
