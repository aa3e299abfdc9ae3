#!/bin/bash
# nvidia-h200, session 10, call C (#8): a wider demo pair (target width 384) trained and evaluated in one command.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/c
trap 'cp /tmp/c/p/pair.tar.* $OUT/ 2>/dev/null; (cd /tmp/c && tar czf $OUT/c.tgz --exclude="pair.tar.*" --exclude=work .); tail -n 25 /tmp/c/pair.log' EXIT
JAX_PLATFORMS=cuda timeout 565 python -m jaxspec.train pair --out /tmp/c/p --work /tmp/c/work --target-width 384 \
  --time-budget-s ${BUDGET:-525} > /tmp/c/pair.log 2>&1
echo "pair rc=$?" >> /tmp/c/pair.log
