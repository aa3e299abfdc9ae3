#!/bin/bash
# Record only: the flags it sets were removed with their code (bench/NOTES.md, sessions 44-46), and jaxspec now
# refuses unknown JAXSPEC_* variables (pallas_kernels/dispatch.py FLAGS), so it no longer runs.
# #6 (nvidia-h200, one call, ~8 min): tree attention's min_split_keys with the combine kernel loading all splits
# at once, masked (session 45, call 4). Call 3 (bench/results/2026-12-04-h200-s45/call3-kernels/) timed the op on
# the device: at 1K / N = 16 the default (33 splits of 32 keys, jnp combine) 22.6 us a layer, 8 splits 15.0, but
# min_split_keys 128 / 256 25.4 / 28.1 with a combine kernel that looped over the splits one load after another
# (min 32, all 33 splits: 39.7); at 32K min_split_keys 108 against the default's 87.7.
# Predicted: the combine kernel now costs about what the jnp combine costs over the used splits, so at 1K / N = 16
# min128 ~15-17 us a layer (s8's 15.0 plus the idle programs), at 32K within +-5 us of the default; the rounds
# 0.1-0.15 ms shorter at 1K with it (16 layers x 6-8 us, verify only).
#   1. the op alone at 1K / 32K, N = 16 / 64: default, 8 splits, min_split_keys 128 / 256 (device times);
#   2. the min_split_keys GPU tests;
#   3. the rounds at 1K, one lease: defaults, then JAXSPEC_TREE_ATTENTION_MIN_SPLIT_KEYS = 128 and 256.
#   OUT=... bash bench/next/k_s45_combine.sh    (writes $OUT/s45-combine.tgz and $OUT/rounds-ab.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
START=$SECONDS
save() { tar czf $OUT/s45-combine.tgz -C $W .; }
timeout 120 python -m pallas_kernels.tree_attention.bench --prefixes 1024,32768 --sizes 16,64 --no-reference \
  --splits 8 --min-split-keys 128,256 --json $W/attn-combine.json > $W/attn-combine.log 2>&1
echo "attention bench rc=$? at $((SECONDS - START)) s"; grep "prefix" $W/attn-combine.log | cut -c1-100; save
timeout 120 python -m pytest -q -rA -m gpu tests/test_tree_attention_kernel.py -k min_split_keys \
  -p no:cacheprovider > $W/gpu-tests-min-split.log 2>&1
echo "min_split tests rc=$? at $((SECONDS - START)) s"; tail -2 $W/gpu-tests-min-split.log; save
bash bench/next/k_rounds_ab.sh "" "JAXSPEC_TREE_ATTENTION_MIN_SPLIT_KEYS=128" "JAXSPEC_TREE_ATTENTION_MIN_SPLIT_KEYS=256"
