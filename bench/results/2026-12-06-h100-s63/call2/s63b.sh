#!/bin/bash
# Session 63's second call (either card, ~4 min): the 8K chain's causal attention, the tree attention kernel
# against cuDNN's and jax's Mosaic GPU attention (bench/next/k_attn_libs.py), and the state pass's variants around
# 16 value columns on 2 warps (bench/next/k_chain_pass.py).   OUT=... bash bench/next/s63b.sh  (-> $OUT/s63b.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
trap 'tar czf $OUT/s63b.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt 2>/dev/null
git log -1 --format='%h %s' > $W/commit.txt
timeout 240 python bench/next/k_attn_libs.py $W/attn-libs.json ${SMALL:+--small} > $W/attn-libs.log 2>&1
echo "attn libs rc=$?"; grep "^{" $W/attn-libs.log
timeout 200 python bench/next/k_chain_pass.py $W/chain-pass.json ${SMALL:+--small} > $W/chain-pass.log 2>&1
echo "sweep rc=$?"; grep -E "^(state_pass|chain_delta_rule)" $W/chain-pass.log
