#!/bin/bash
# Session 75 (either card, ~6 min on the real shape; predictions in bench/NOTES.md "## Session 75"):
#   1. session 74's profiler fix: accept + commit by part after a verify of a chain of 16 and of a tree of 64, the
#      state now donated (bench.verify_profile --commit): no MemcpyD2D left;
#   2. the commit's GDN state update as one Pallas kernel over all layers against XLA's (k_commit_fused.py, a
#      prototype removed once it became pallas_kernels/gdn_commit: `git show a18473d:bench/next/k_commit_fused.py`).
#   OUT=... bash bench/next/s75.sh        (writes $OUT/s75.tgz, and $OUT/commit_fused.json as it goes)
#   dry run: CONFIG=tiny JAX_PLATFORMS=cpu PY=.venv/bin/python OUT=... bash bench/next/s75.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
PY=${PY:-python}
W=$(mktemp -d)
trap 'tar czf $OUT/s75.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader | tee $W/gpu.txt 2>/dev/null
START=$SECONDS
for spec in "16 chain" "64 tree"; do
  set -- $spec
  timeout 120 $PY -m bench.verify_profile --config $CONFIG --nodes $1 $([ $2 = tree ] && echo --tree) --commit \
    --hlo --out $W > $W/commit$1.log 2>&1
  echo "commit after verify($1) rc=$? at $((SECONDS - START)) s"
done
$PY - $W <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    d = json.load(open(f))
    print(f.name, f"kernels {d['kernel_ms_per_step']:.3f} ms/step, {d['kernels_per_step']:.0f} kernels")
    for k in d["top_kernels"][:6]:
        ms, n, op = k["ms_per_step"], k["count_per_step"], str(k["op_name"])[:60]
        print(f"  {ms * 1e3:8.1f} us x{n:.0f} {k['kernel'][:40]} {op}")
PY
TINY=$([ $CONFIG = tiny ] && echo --tiny)
timeout $((560 - (SECONDS - START))) $PY bench/next/k_commit_fused.py $TINY --out $OUT > $W/commit_fused.log 2>&1
echo "commit_fused rc=$? at $((SECONDS - START)) s"
$PY - $OUT/commit_fused.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["case"], r["variant"], r.get("error") or f"{r['device_us']:.1f} us, {r['kernels']:.0f} kernels, "
          f"err {r['rel_err']:.1e}, compile {r['compile_s']:.1f} s")
PY
