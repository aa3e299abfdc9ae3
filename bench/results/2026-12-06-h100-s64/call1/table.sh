#!/bin/bash
# #6's table in one call (nvidia-h200, ~9 min with its 1K / 32K / 128K rounds): `python -m bench.table` with the
# budget of 63 the tables since session 37 used, its parts' files tarred into one (session 43's call 5 wrote them
# loose under $OUT and the device did not return table.md: too many files).
#   OUT=... bash bench/next/table.sh [extra bench.table flags]     (writes $OUT/table.tgz)
# Any JAXSPEC_* flag set in the environment reaches the parts and is named in table.md.
# On an 80 GB H100 the 3 contexts fit with `--prefill 2048` (session 58). Since session 59 the 8K prefill runs alone
# on an H100 (not yet inside the table), and the round loops compile with XLA's slop factor 100, which removed the
# +3 ms that remat near the card's memory put on DDTree(63) at 1K with the 128K cache.
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
trap 'tar czf $OUT/table.tgz -C $W .' EXIT
timeout 575 python -m bench.table --config real --contexts 1024,32768,131072 --budget 63 --deadline-s 555 \
  --out $W "$@" > $W/call.log 2>&1
echo "table rc=$?"; grep "| 1024 |" $W/table.md
