#!/bin/bash
# Session 63's fourth call (either card, ~7 min), after the chain attention op's first GPU run (call 3):
#   1. the engine's GPU tests (fp32 target: chains through the tree kernel; a new bf16 one: the chain op's cuDNN path
#      in a prefill of pieces of 128, against the tree op's, and lossless on top);
#   2. Engine.prefill of 8K tokens in pieces of 256 and 1024 and as one piece, with the chain op (session 62:
#      1166.67 / 972.29 / 949.22 ms without it);
#   3. a piece's prefix part: the prefix kernel against cuDNN with a padding mask (bench/next/k_prefix_cudnn.py).
#   OUT=... bash bench/next/s63d.sh    (-> $OUT/s63d.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
trap 'tar czf $OUT/s63d.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt 2>/dev/null
git log -1 --format='%h %s' > $W/commit.txt
OUT=$W timeout 230 bash bench/next/gpu_tests.sh engine > /dev/null 2>&1
echo "engine tests rc=$?"; grep -E "^(FAILED|ERROR)" $W/gpu-tests-engine.log | cut -c1-200; grep -E "passed|failed" $W/gpu-tests-engine.log | tail -1
timeout 200 python -m bench.harness --config real --prompt 8192 --contexts '' --prefill-chunks 256,1024,8192 \
  --out $W/prefill-pieces.json > $W/prefill-pieces.log 2>&1
echo "pieces rc=$?"; grep -E "prefill" $W/prefill-pieces.log | grep -v "^WARNING" | cut -c1-200 | tail -5
timeout 90 python bench/next/k_prefix_cudnn.py $W/prefix-cudnn.json > $W/prefix-cudnn.log 2>&1
echo "prefix rc=$?"; grep "^{" $W/prefix-cudnn.log
