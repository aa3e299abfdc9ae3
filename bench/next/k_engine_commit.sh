#!/bin/bash
# #6 (nvidia-h200, one call, ~5 min): session 44's last call, at the tree where the GDN output gate kernel and the
# tree delta rule's gram_kernel are gone (both slower than XLA on the H200) and the GDN tree inputs kernel reads
# A_log / dt_bias itself.
#   1. The engine's GPU tests: lossless against greedy AR with every kernel on, and at the defaults.
#   2. The DFlash and DDTree(63) rounds at 1K (for the record at this tree; no A/B).
#   3. accept + commit by part after verify(16) and after a DDTree verify(64), with the optimized HLO (--hlo): what
#      the commit's 0.38 / 0.47 ms of device time (#6's table, session 43; goal for build + accept + commit 0.5 ms)
#      are spent on, for the next session's plan.
# Predicted: the engine tests pass; the rounds within 0.1 ms of call 4's (17.53 / 21.49 ms); commit has no kernel
# above ~0.15 ms a step, the state update (states_at) the largest.
# Each step tars what it wrote at once (a call cut by its limit still returns the steps before).
#   OUT=... bash bench/next/k_engine_commit.sh     (writes $OUT/engine-commit.tgz; CONFIG=tiny JAX_PLATFORMS=cpu
#   for a dry run, which skips the GPU tests)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
save() { tar czf $OUT/engine-commit.tgz -C $W .; }
if [ "$JAX_PLATFORMS" != cpu ]; then
  timeout 200 python -m pytest -q -rA -m gpu tests/test_kernels_engine.py -p no:cacheprovider \
    > $W/gpu-tests-engine.log 2>&1
  echo "engine tests rc=$? at $((SECONDS - START)) s"; tail -3 $W/gpu-tests-engine.log; save
fi
timeout 170 python -m bench.rounds --config $CONFIG --context 1024 --phases dflash,ddtree --rounds-only \
  --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds.json > $W/rounds.log 2>&1
echo "rounds rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds.log | cut -c1-200; save
for spec in "16 chain" "64 tree"; do
  set -- $spec
  timeout 80 python -m bench.verify_profile --config $CONFIG --nodes $1 $([ $2 = tree ] && echo --tree) --commit \
    --hlo --out $W/commit > $W/commit$1.log 2>&1
  echo "commit after verify($1) rc=$? at $((SECONDS - START)) s"
  grep -m2 "kernel_ms_per_step\|kernels_per_step" $W/commit$1.log; save
done
