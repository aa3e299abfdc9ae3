#!/bin/bash
# #6 (nvidia-h200, one call, ~2 min a setting with the default phases): the rounds at 1K under several settings of the
# JAXSPEC_* flags, one lease, so that a kernel's default is judged on the whole round against its reference.
#   OUT=... bash bench/next/k_rounds_ab.sh "SETTING" ["SETTING" ...]     (writes $OUT/rounds-ab.tgz)
# A SETTING is a space-separated list of VAR=value ("" for the defaults), e.g.
#   bash bench/next/k_rounds_ab.sh "JAXSPEC_GDN_TREE_INPUTS=reference" ""
# PHASES (default dflash,ddtree; ar for the AR loop) and CONFIG (default real; tiny with JAX_PLATFORMS=cpu for a dry
# run) are passed to bench.rounds. Each setting's JSON and log are named by its index: rounds-0.json, rounds-1.json...
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
PHASES=${PHASES:-dflash,ddtree}
W=$(mktemp -d)
START=$SECONDS
trap 'tar czf $OUT/rounds-ab.tgz -C $W .' EXIT
i=0
for setting in "$@"; do
  echo "$setting" > $W/setting-$i.txt
  env $setting timeout 170 python -m bench.rounds --config $CONFIG --context 1024 --phases $PHASES --rounds-only \
    --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$i.json > $W/rounds-$i.log 2>&1
  echo "[$i] '$setting' rc=$? at $((SECONDS - START)) s"; grep "_round \|ar_round" $W/rounds-$i.log | cut -c1-210
  i=$((i + 1))
done
