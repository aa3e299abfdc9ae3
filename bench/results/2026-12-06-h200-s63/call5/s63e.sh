#!/bin/bash
# Session 63's fifth call (either card, ~7 min): call 4 again, as it should have run. Its engine tests were cut by
# the script's 230 s limit, which killed gpu_tests.sh's shell but not the pytest under it, so the prefill in pieces
# after it found the GPU's memory taken. Here pytest runs under the limit itself.
#   1. the engine's GPU tests (the fp32 target's lossless tests; the bf16 prefill through the chain op);
#   2. Engine.prefill of 8K tokens in pieces of 256 and as one piece, with the chain op.
#   OUT=... bash bench/next/s63e.sh    (-> $OUT/s63e.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
trap 'tar czf $OUT/s63e.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt 2>/dev/null
git log -1 --format='%h %s' > $W/commit.txt
timeout 330 python -m pytest -q -rA -m gpu tests/test_kernels_engine.py tests/test_engine.py -p no:cacheprovider \
  --durations=10 > $W/gpu-tests-engine.log 2>&1
echo "engine tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)" $W/gpu-tests-engine.log | cut -c1-160; tail -1 $W/gpu-tests-engine.log
timeout 200 python -m bench.harness --config real --prompt 8192 --contexts '' --prefill-chunks 256,8192 \
  --out $W/prefill-pieces.json > $W/prefill-pieces.log 2>&1
echo "pieces rc=$?"; grep -E "prefill" $W/prefill-pieces.log | grep -v "^WARNING" | cut -c1-200 | tail -5
