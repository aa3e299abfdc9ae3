#!/bin/bash
# Ran in session 44 (bench/results/2026-12-04-h200-s44/tdr-gram/): gram_kernel was slower than XLA and was removed, so
# this script is the record of that call.
# #6 (nvidia-h200, one call, ~3 min): the tree delta rule's Gram products from their own kernel (`gram_kernel`,
# `_gram_kernel` in pallas_kernels/tree_delta_rule/pallas_triton.py), written in session 43 after its GPU time was
# spent; CPU-tested only (interpret mode, the Triton lowering for an abstract H200).
# Session 43's verify(64) profile (bench/results/2026-12-04-h200-s43/inputs-second-form/verify-pallas_triton/
# verify-tree64.json): for blocks of more than one tile XLA forms K K^T and Q K^T as a batched dot plus a slice and
# a transpose: gemm_fusion_dot_449 0.408 + wrapped_slice 0.067 + input_transpose_fusion_47 0.062 = 0.54 ms a step,
# 11 us a layer. The kernel: a program per (batch row, key head, tile of 16 rows), fp32 FMA dots per key tile.
#   1. The op alone, 48 stacked layers, at N = 64, 65, 128: the default against gram_kernel.
#   2. gram_kernel's GPU tests (real shape, chain of 64, tree of 65).
# Predicted: gram_kernel 5-8 us a layer shorter at N = 64 / 65 (verify(64) 0.25-0.4 ms shorter). If it wins by
# >= 4 us a layer: make it the default for blocks of more than one tile, then time the DDTree(63) round against the
# commit before in one lease (`_base/` from `git archive`, run from inside `_base/`).
#   OUT=... bash bench/next/k_tdr_gram.sh     (writes $OUT/tdr-gram.tgz; JAX_PLATFORMS=cpu for a dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
START=$SECONDS
trap 'tar czf $OUT/tdr-gram.tgz -C $W .' EXIT
V=pallas_triton,pallas_triton/gram_kernel
[ "$JAX_PLATFORMS" = cpu ] && V=xla
timeout 200 python -m pallas_kernels.tree_delta_rule.bench --sizes 64,65,128 --sweep --impls $V \
  --json $W/tdr-gram.json > $W/tdr-gram.log 2>&1
echo "bench rc=$? at $((SECONDS - START)) s"; grep "N=" $W/tdr-gram.log | cut -c1-150
timeout $((560 - (SECONDS - START))) python -m pytest -q -rA -m gpu tests/test_tree_delta_rule_kernel.py \
  -k "gram_kernel" -p no:cacheprovider > $W/gpu-tests-gram.log 2>&1
echo "tests rc=$? at $((SECONDS - START)) s"; tail -4 $W/gpu-tests-gram.log
