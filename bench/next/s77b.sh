#!/bin/bash
# Session 77's second call where the 1K table does not fit (either card, ~3-4 min; predictions in bench/NOTES.md
# "## Session 77"): gdn_commit's own GPU tests (on an H100 only so far), then the three GDN kernel benches that
# bench.table now runs as parts (gdn_decode, gdn_tree_inputs at 16 / 64, gdn_commit after a path of 16).
#   OUT=... bash bench/next/s77b.sh        (writes $OUT/s77b.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
trap 'tar czf $OUT/s77b.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt
START=$SECONDS
timeout 200 python -m pytest -q -rA -m gpu tests/test_gdn_commit_kernel.py > $W/gpu-tests-gdn-commit.log 2>&1
echo "gdn_commit GPU tests rc=$? at $((SECONDS - START)) s"; tail -3 $W/gpu-tests-gdn-commit.log
for op in gdn_decode "gdn_tree_inputs --sizes 16,64" "gdn_commit --paths 16"; do
  set -- $op
  timeout 150 python -m pallas_kernels.$1.bench "${@:2}" --json $W/$1.json > $W/$1.log 2>&1
  echo "$1 bench rc=$? at $((SECONDS - START)) s"; tail -4 $W/$1.log
done
