#!/bin/bash
# nvidia-h200, session 9, call F: issue #6's table (bench.table) at the real shape, every part within the deadline.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/f
trap '(cd /tmp/f && tar czf $OUT/f.tgz .); tail -5 /tmp/f/table.log; cat /tmp/f/table/table.md 2>/dev/null' EXIT
JAX_PLATFORMS=cuda python -m bench.table --config real --contexts 1024,32768,131072 --prefill 8192 \
  --deadline-s ${DEADLINE:-570} --out /tmp/f/table > /tmp/f/table.log 2>&1
echo "table rc=$?" >> /tmp/f/table.log
