#!/bin/bash
# #6 / the prefill (either card, one call, ~8 min): tree attention's tiles for prefill shapes, and the engine's own
# prefill in pieces. The kernel's tiles (64 x 32 on 4 warps for bf16 at head_dim 256) were chosen for verify (N <= 65,
# session 11); in session 60 the 8K prefill's attention ran at ~135 TFLOP/s on the causal half, a fifth of the bf16
# matmul rate (bench/results/2026-12-06-h200-s60/). Times every tile variant that fits on
#   chain8k    a chain of 8192 from an empty cache (the harness's one-piece 8K prefill)
#   piece256   a chain of 256 after an 8192-token prefix (one of the engine's prefill pieces, --prefill-chunk 256)
# then the 8K prompt through Engine.prefill in pieces of 256 (generate's default), 1024 and 8192, beside the harness's
# one-piece prefill (bench.harness --prefill-chunks; never timed on the real shape).
#   OUT=... bash bench/next/k_prefill_attn.sh       (writes $OUT/prefill-attn.tgz)
#   JAX_PLATFORMS=cpu OUT=/tmp/x SMALL=1 bash bench/next/k_prefill_attn.sh      (dry run: flags only)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
trap 'tar czf $OUT/prefill-attn.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt 2>/dev/null
git log -1 --format='%h %s' > $W/commit.txt
if [ -n "$SMALL" ]; then A="0:64 64:32"; else A="0:8192 8192:256"; fi
for pn in $A; do
  p=${pn%:*}; n=${pn#*:}
  timeout 150 python -m pallas_kernels.tree_attention.bench --prefixes $p --sizes $n --shape chain --sweep \
    --no-reference --layers 2 --iters 5 --json $W/chain-$p-$n.json > $W/chain-$p-$n.log 2>&1
  echo "prefix $p, chain of $n: rc=$?"; grep -v "^WARNING: Location" $W/chain-$p-$n.log | grep "N=" | sort -t'(' -k2 \
    | head -20
done
if [ -n "$SMALL" ]; then H="--config tiny --prompt 40 --prefill-chunks 16,64 --copy-gib 0.01 --matmul-n 64"
else H="--config real --prompt 8192 --prefill-chunks 256,1024,8192"; fi
timeout 230 python -m bench.harness $H --contexts '' --out $W/engine-prefill.json > $W/engine-prefill.log 2>&1
echo "engine prefill rc=$?"; grep -v "^WARNING: Location" $W/engine-prefill.log | grep "prefill P=" | grep -v profile
