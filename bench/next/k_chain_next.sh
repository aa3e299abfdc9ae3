#!/bin/bash
# #6 / the prefill (either card, one call, ~7 min): session 61's chain delta rule, next steps (sessions 61-62):
#   1. the state pass at one layer's 8K shape (bench/next/k_chain_pass.py: the default, tf32x3 / 32 value columns /
#      one stage / O after the pass, 2.359 ms a layer on an H100 in session 62, beside three neighbours);
#   2. the op's GPU tests and the engine's (the engine's with a 90-token prompt: the chain op inside the engine);
#   3. the 8K prefill with its profile by part (936.65 ms on an H100 at a35c645).
#   OUT=... [ENGINE=0] [DUMP=1] bash bench/next/k_chain_next.sh   (writes $OUT/chain-next.tgz; ENGINE=0 skips the
#                       engine's GPU tests, ~2 min; DUMP=1 keeps the prefill's trace and optimized HLO in dump/)
#   JAX_PLATFORMS=cpu OUT=/tmp/x SMALL=1 bash bench/next/k_chain_next.sh      (dry run: the sweep interpreted, the
#                                                                             tiny config's prefill, no GPU tests)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
trap 'tar czf $OUT/chain-next.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt 2>/dev/null
git log -1 --format='%h %s' > $W/commit.txt
timeout 150 python bench/next/k_chain_pass.py $W/chain-pass.json ${SMALL:+--small} > $W/chain-pass.log 2>&1
echo "sweep rc=$?"; grep -E "^(state_pass|chain_delta_rule)" $W/chain-pass.log
if [ -z "$SMALL" ]; then
  timeout 120 python -m pytest -q -rA -m gpu tests/test_chain_delta_rule.py -p no:cacheprovider > $W/gpu-chain.log 2>&1
  echo "chain tests rc=$?"; tail -1 $W/gpu-chain.log
  if [ "${ENGINE:-1}" = 1 ]; then
    OUT=$W timeout 200 bash bench/next/gpu_tests.sh engine > /dev/null 2>&1
    echo "engine tests rc=$?"; grep -E "passed|failed" $W/gpu-tests-engine.log | tail -1
  fi
  H="--config real --prompt 8192"
else H="--config tiny --prompt 200 --copy-gib 0.01 --matmul-n 64"; fi
timeout 150 python -m bench.harness $H --contexts '' --profile-prefill ${DUMP:+--dump-dir $W/dump} --out $W/prefill.json > $W/prefill.log 2>&1
echo "prefill rc=$?"; grep -v "^WARNING: Location" $W/prefill.log | grep -E "prefill P=.*(ms,|profile)|rror" | cut -c1-220 \
  | tail -2
