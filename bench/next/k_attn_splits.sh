#!/bin/bash
# #6 (nvidia-h200, one call, ~4 min): tree attention's prefix splits at short contexts. Written in session 44 from
# that session's verify(16) HLO (bench/results/2026-12-04-h200-s44/inputs-params/verify/verify-chain16.hlo.txt.gz):
# at a 1K prefix the kernel spreads the prefix over ~33 splits of 32 keys, and writes their fp32 partials
# ([4 kv heads, 34 splits, 128 rows, 256] = 17.8 MB a layer, 8x the KV bytes), which the jnp combine then reads back
# in three reductions (input_reduce_fusion_30 0.070, input_exponential_reduce_fusion_15 0.029, input_reduce_fusion_31
# 0.025 ms a verify(16) step; the kernel itself 0.20 ms).
#   1. The op alone (kernel + combine; 4 layers, distinct caches) at 1K and 32K prefixes, N = 16 and 64: the default,
#      fixed split counts 4 / 8 / 16, and the opt-in min_split_keys = 128 / 256 / 512 (a sequence uses only the
#      splits that get that many keys; the combine kernel merges those only).
#   2. The opt-in's GPU tests (test_gpu_min_split_keys: 1K and 32K, N = 16 / 65, and an empty prefix).
# Predicted: at 1K, N = 16, min_split_keys = 256 (4 splits used) 6-10 us a layer shorter than the default (~20 us:
# partials 2.6 MB instead of 17.8); at 32K within +-2 us (all 33 splits used either way). If so: make 256 the
# default (pallas_triton.tree_attention), then verify(16) by part and the rounds against the commit before in one
# lease (predicted verify(16) 0.1-0.16 ms shorter at 1K).
#   OUT=... bash bench/next/k_attn_splits.sh     (writes $OUT/attn-splits.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
START=$SECONDS
save() { tar czf $OUT/attn-splits.tgz -C $W .; }
timeout 240 python -m pallas_kernels.tree_attention.bench --prefixes 1024,32768 --sizes 16,64 --no-reference \
  --splits 4,8,16 --min-split-keys 128,256,512 --json $W/attn-splits.json > $W/attn-splits.log 2>&1
echo "bench rc=$? at $((SECONDS - START)) s"; grep "prefix" $W/attn-splits.log | cut -c1-130; save
timeout 200 python -m pytest -q -rA -m gpu tests/test_tree_attention_kernel.py -k min_split_keys -p no:cacheprovider \
  > $W/gpu-tests-min-split.log 2>&1
echo "tests rc=$? at $((SECONDS - START)) s"; tail -3 $W/gpu-tests-min-split.log; save
