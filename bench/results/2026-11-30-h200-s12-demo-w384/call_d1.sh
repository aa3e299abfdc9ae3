#!/bin/bash
# Next GPU session, #8 call 1 (nvidia-h200, ~9.5 min): a 384-wide demo target (session 10 showed it writes more
# confident continuations: mean top-1 p 0.80 against the shipped 0.72) and a first drafter for it, trained on
# its greedy continuations only (made with the kernels now: ~1 s per 4096 x 192 tokens), no evaluation here.
# Run from the repo root: JAXSPEC_COMMIT=<hash> bash bench/next/d1_pair_w384.sh
# The pair (target ~37 MB + drafter, pair.tar.NN parts) comes back in $OUT; the work dir .gpu/w384 stays on the
# machine while it is warm (call 2 continues the drafter from it within 30 s).
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/d1 .gpu
trap 'cp /tmp/d1/p/pair.tar.* $OUT/ 2>/dev/null; (cd /tmp/d1 && tar czf $OUT/d1.tgz --exclude="pair.tar.*" .); tail -n 20 /tmp/d1/pair.log' EXIT
JAX_PLATFORMS=cuda timeout $(( ${BUDGET:-530} + 35 )) python -m jaxspec.train pair --out /tmp/d1/p --work .gpu/w384 --target-width 384 \
  --drafter-data greedy --no-eval --time-budget-s ${BUDGET:-530} > /tmp/d1/pair.log 2>&1
echo "pair rc=$?" >> /tmp/d1/pair.log
