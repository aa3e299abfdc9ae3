#!/bin/bash
# Session 63's third call (either card, ~6 min): pallas_kernels/chain_attention (a prefill piece's attention: the
# prefix by the tree kernel's prefix programs, the block by cuDNN's causal flash attention), first GPU run:
#   1. its GPU tests and the tree attention kernel's (whose wrapper the split refactored);
#   2. the 8K prefill with its profile by part, the chain op (default) against JAXSPEC_CHAIN_ATTENTION=tree (what
#      ran before), one lease;
#   3. the engine's GPU tests with the chain op forced on every chain (JAXSPEC_CHAIN_ATTENTION=pallas_cudnn: prefill
#      pieces, DFlash blocks, the AR step), lossless against AR.   OUT=... bash bench/next/s63c.sh (-> $OUT/s63c.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
trap 'tar czf $OUT/s63c.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt 2>/dev/null
git log -1 --format='%h %s' > $W/commit.txt
timeout 200 python -m pytest -q -rA -m gpu tests/test_chain_attention.py tests/test_tree_attention_kernel.py \
  -p no:cacheprovider > $W/gpu-attn.log 2>&1
echo "attention tests rc=$?"; grep -E "^(FAILED|ERROR)" $W/gpu-attn.log | cut -c1-200; tail -1 $W/gpu-attn.log
for v in chain tree; do
  [ $v = tree ] && export JAXSPEC_CHAIN_ATTENTION=tree
  timeout 150 python -m bench.harness --config real --prompt 8192 --contexts '' --profile-prefill \
    --out $W/prefill-$v.json > $W/prefill-$v.log 2>&1
  echo "prefill $v rc=$?"; grep -E "prefill P=.*(ms,|profile)" $W/prefill-$v.log | cut -c1-260
done
unset JAXSPEC_CHAIN_ATTENTION
JAXSPEC_CHAIN_ATTENTION=pallas_cudnn OUT=$W timeout 200 bash bench/next/gpu_tests.sh engine > /dev/null 2>&1
echo "engine tests (chain op forced) rc=$?"; grep -E "passed|failed" $W/gpu-tests-engine.log | tail -1
