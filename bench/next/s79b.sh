#!/bin/bash
# Next GPU session, either card (~3-5 min; predictions in bench/NOTES.md "## Session 79"): can the residual add +
# RMSNorm after a split-K product be one kernel, if it takes the product's K slices? bench/next/k_split_norm.py at
# 16, 64 and 1 rows, 16 pairs at the real widths, every form, with the compiled programs' text.
#   OUT=... bash bench/next/s79b.sh       (writes $OUT/s79b.tgz)
#   dry run: JAX_PLATFORMS=cpu PY=.venv/bin/python SMALL=--small OUT=... bash bench/next/s79b.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
PY=${PY:-python}
W=$(mktemp -d)
trap 'tar czf $OUT/s79b.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | tee $W/gpu.txt
timeout 420 $PY bench/next/k_split_norm.py $SMALL --out $W/split-norm.json --hlo $W/hlo > $W/split-norm.log 2>&1
echo "k_split_norm rc=$?"; cat $W/split-norm.log
