#!/bin/bash
# #6 (nvidia-h200, one call, ~5 min): where the tree delta rule should form the Gram tiles and M = P Tb (session 42).
# Session 42's verify(64) profile (bench/results/2026-12-04-h200-s42/tdr-kernel/verify-new/): the prepare kernel
# took 1.25 ms a step (26 us a layer), apply 1.02: prepare is a serial chain per head, 48 programs on 132 SMs.
# `split_m=True` moves M = P Tb out of that chain into `_mix_kernel`, a program per tile of rows. And at N = 16
# the Gram tiles moved inside prepare (its time 0.22 -> 0.41 ms a step, the outside products' 0.35 ms gone).
#   1. The op alone, 48 stacked layers, at N = 16, 64, 65: the default, Gram outside / inside, split_m.
#   2. The kernel's GPU tests for split_m (real shape, chain of 64 and tree of 65).
# Predicted: split_m 3-6 us a layer shorter at N = 64 / 65 (27.4 / 29.7 us now); at N = 16 Gram inside ~2-4 us
# a layer shorter than outside. If split_m wins by >= 2 us a layer: make it the default for blocks of more than one
# tile, then time the rounds (k_tdr_grouped.sh rounds, with _base/ at the commit before).
#   OUT=... bash bench/next/k_tdr_split.sh     (writes $OUT/tdr-split.tgz; JAX_PLATFORMS=cpu for a dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
START=$SECONDS
V=pallas_triton,pallas_triton/gram_outside,pallas_triton/gram_inside,pallas_triton/split_m
[ "$JAX_PLATFORMS" = cpu ] && V=xla
timeout 300 python -m pallas_kernels.tree_delta_rule.bench --sizes 16,64,65 --sweep --impls $V \
  --json $W/tdr-split.json > $W/tdr-split.log 2>&1
echo "bench rc=$? at $((SECONDS - START)) s"; grep "N=" $W/tdr-split.log | cut -c1-150
timeout $((560 - (SECONDS - START))) python -m pytest -q -rA -m gpu tests/test_tree_delta_rule_kernel.py \
  -k "split_m or default_dispatch" -p no:cacheprovider > $W/gpu-tests-split.log 2>&1
echo "tests rc=$? at $((SECONDS - START)) s"; tail -8 $W/gpu-tests-split.log
tar czf $OUT/tdr-split.tgz -C $W .
