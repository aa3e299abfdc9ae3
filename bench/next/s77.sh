#!/bin/bash
# Next GPU session (either card, ~4 min; predictions in bench/NOTES.md "## Plan for the next GPU session"): accept +
# commit's kernels after a verify of a chain of 16 and of a tree of 64 (bench.verify_profile --commit, the state
# donated), with conv_commit on its reference and on its kernel (JAXSPEC_CONV_COMMIT); gdn_commit on its default.
#   OUT=... bash bench/next/s77.sh        (writes $OUT/s77.tgz)
#   dry run: CONFIG=tiny JAX_PLATFORMS=cpu PY=.venv/bin/python OUT=... bash bench/next/s77.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
PY=${PY:-python}
W=$(mktemp -d)
trap 'tar czf $OUT/s77.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | tee $W/gpu.txt
START=$SECONDS
for conv in reference pallas_triton; do
  [ $JAX_PLATFORMS = cpu ] && [ $conv = pallas_triton ] && conv=pallas_interpret
  mkdir -p $W/conv-$conv
  for spec in "16 chain" "64 tree"; do
    set -- $spec
    JAXSPEC_CONV_COMMIT=$conv timeout 150 $PY -m bench.verify_profile --config $CONFIG --nodes $1 \
      $([ $2 = tree ] && echo --tree) --commit --out $W/conv-$conv > $W/conv-$conv/commit$1.log 2>&1
    echo "conv_commit=$conv, commit after verify($1): rc=$? at $((SECONDS - START)) s"
  done
done
$PY bench/next/commit_summary.py $W
