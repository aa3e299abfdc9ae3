#!/bin/bash
# Session 12, after the table: the drafter's full layer on the tree-attention kernel (its block K/V in
# scratch rows past the context, the kernel reading only rows up to the block's end). The engine's lossless
# GPU test with every kernel on, then the DFlash phases at 1K and 128K with the table's cache (137292 slots).
# Prediction: drafter step (device) 2.58 -> ~1.8 ms at 1K and ~2.0 at 128K; DFlash round 19.92 -> ~19.1 at 1K.
# JAXSPEC_COMMIT=<hash> bash call_dk.sh (from the repository root)
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/dk
trap '(cd /tmp/dk && tar czf $OUT/dk.tgz .); tail -3 /tmp/dk/engine.log; grep -h "draft\|dflash_round\|rc=" /tmp/dk/rounds.log | tail -12' EXIT
JAX_PLATFORMS=cuda timeout 120 python -m pytest -q -m gpu tests/test_kernels_engine.py > /tmp/dk/engine.log 2>&1
echo "engine rc=$?" >> /tmp/dk/engine.log
JAX_PLATFORMS=cuda timeout ${LIMIT:-200} python -m bench.rounds --config real --context 1024,131072 --phases dflash \
  --k 20 --rounds 10 --out /tmp/dk/rounds.json > /tmp/dk/rounds.log 2>&1
echo "rounds rc=$?" >> /tmp/dk/rounds.log
