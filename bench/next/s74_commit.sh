#!/bin/bash
# Session 74 (either card, ~5 min on the real shape): accept + commit by part after a verify of a chain of 16 and of
# a tree of 64, then the verify of 64 by part, with the optimized HLO: the baseline for the folded-commit idea
# (bench/NOTES.md, "## Plan for the next GPU session", session 74's line). Predictions: NOTES "## Session 74".
#   OUT=... bash bench/next/s74_commit.sh   (writes $OUT/s74-commit.tgz)
#   dry run: CONFIG=tiny JAX_PLATFORMS=cpu PY=.venv/bin/python OUT=... bash bench/next/s74_commit.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
PY=${PY:-python}
W=$(mktemp -d)
trap 'tar czf $OUT/s74-commit.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt 2>/dev/null
START=$SECONDS
for spec in "16 chain --commit" "64 tree --commit" "64 tree"; do
  set -- $spec
  timeout 120 $PY -m bench.verify_profile --config $CONFIG --nodes $1 $([ $2 = tree ] && echo --tree) $3 --hlo \
    --out $W > $W/$([ -n "$3" ] && echo commit || echo verify)$1.log 2>&1
  echo "$spec rc=$? at $((SECONDS - START)) s"
done
$PY - $W <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    d = json.load(open(f))
    print(f.name, f"kernels {d['kernel_ms_per_step']:.3f} ms/step, {d['kernels_per_step']:.0f} kernels")
    for k in d["top_kernels"][:8]:
        ms, n, op = k["ms_per_step"], k["count_per_step"], str(k["op_name"])[:60]
        print(f"  {ms * 1e3:8.1f} us x{n:.0f} {k['kernel'][:40]} {op}")
PY
