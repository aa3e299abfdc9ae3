#!/bin/bash
# #6 (nvidia-h200, one call, ~5 min): where a round's time goes, by stage. Session 45 (`bench.rounds
# --trace-rounds`): the DFlash and DDTree(63) round loops at 1K profiled by kernel, each kernel charged to its stage
# (draft, build, verify, accept, commit, draft_update, the loop's own) and to the model's parts, per round, with
# the loops' optimized HLO beside. JAXSPEC_LOOP_GRAPHS=none: a CUDA graph hides the loop's kernels from the profiler
# (the rounds are then slower than the graphed ones; the stage split is what this call is for).
# Predicted, kernel ms a round (session 44's verify-by-part profiles, the s16 table's drafter step):
#   DFlash: verify 15.0-15.4, draft 1.5-1.9, commit 0.35-0.45, accept < 0.05, draft_update < 0.3, loop < 0.2;
#   DDTree(63): verify 18.7-19.1, draft 1.5-1.9, build 0.3-0.6, commit 0.4-0.55, the rest as DFlash.
# If "loop", "unattributed" or "draft_update" hold more than 0.3 ms, that is the next thing to read.
#   OUT=... bash bench/next/k_round_trace.sh     (writes $OUT/round-trace.tgz; CONFIG=tiny JAX_PLATFORMS=cpu dry run;
#   PHASES=dflash for one method, LIMIT=seconds for the run's timeout)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
trap 'tar czf $OUT/round-trace.tgz -C $W .' EXIT
JAXSPEC_LOOP_GRAPHS=none timeout ${LIMIT:-500} python -m bench.rounds --config $CONFIG --context 1024 \
  --phases ${PHASES:-dflash,ddtree} \
  --rounds-only --budgets 63 --round-budget 63 --max-len 8192 --trace-rounds --out $W/round-trace.json \
  > $W/round-trace.log 2>&1
echo "rc=$? at $((SECONDS - START)) s"; grep "_round \|_trace " $W/round-trace.log | cut -c1-400
