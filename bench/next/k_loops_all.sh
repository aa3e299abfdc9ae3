#!/bin/bash
# #6 (nvidia-h200, one call, ~4 min): the DFlash / DDTree(63) round loops compiled as CUDA graphs. Ran in session 40
# (bench/results/2026-12-04-h200-s40/loops/): `all` won, and is the default since 30932de; the text below is as it ran.
# Session 39 (bench/results/2026-12-04-h200-s39/): the AR loop became one CUDA graph once its compile set XLA's
# minimum command-buffer size to 1 (the WHILE counts as one thunk against it): 13.54 -> 13.30 ms a round. Sessions
# 23 / 31 found WHILE / CONDITIONAL command buffers on the DFlash / DDTree(64) loops slower (+1.4 / +1.1 ms), at
# minimum size 5. This times both loops with JAXSPEC_LOOP_GRAPHS=ar (the default: no graph options for them) and
# =all (LOOP_GRAPH_OPTIONS, minimum size 1 included), in one lease.
# Predicted: `all` 0.2-0.5 ms shorter rounds if their WHILE converts whole. If it holds: make `all` the default
# (jaxspec/engine.py loop_compiler_options) after `JAX_PLATFORMS=cuda python -m pytest -m gpu
# tests/test_kernels_engine.py`, then the table (`python -m bench.table --config real --budget 63 ...`).
#   bash bench/next/k_loops_all.sh        (writes $OUT/loops.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
OUT=${OUT:?}
W=/tmp/kl; mkdir -p $W
for G in ar all; do
  JAXSPEC_LOOP_GRAPHS=$G timeout 280 python -m bench.rounds --config real --context 1024 --phases dflash,ddtree \
    --rounds-only --budgets 63 --round-budget 63 --max-len 8192 --out $W/loops-$G.json > $W/loops-$G.log 2>&1
  echo "$G rc=$?"; grep "round_device_loop\|_round " $W/loops-$G.log | cut -c1-220
done
tar czf $OUT/loops.tgz -C $W .
