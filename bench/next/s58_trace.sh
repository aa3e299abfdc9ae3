#!/bin/bash
# Session 58, #6: what in the DDTree(63) round grows with the cache's length? At 1K context the round took 28.92 ms
# with a 137K-slot cache (the 3-context table, H100) and 26.66 with a ~39K one (session 57), while its standalone
# verify(64) and build + accept + commit did not change. The round traced (loop graphs off, kernels charged to
# stages) at both cache lengths; the longest kernels of each printed. (s58_fix.sh found no cache copy in the HLO.)
#   OUT=... bash bench/next/s58_trace.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda} JAXSPEC_LOOP_GRAPHS=none
OUT=${OUT:?}
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
D=$(mktemp -d)
for M in 137292 38000; do
  timeout 240 python -m bench.rounds --config real --context 1024 --phases ddtree --rounds-only \
    --round-budget 63 --max-len $M --trace-rounds --out $OUT/trace-$M.json > $OUT/trace-$M.log 2>&1
  echo "max_len $M rc=$?"; grep "ddtree63_" $OUT/trace-$M.log | cut -c1-300
done
python - <<'PY'
import json, os
for m in ("137292", "38000"):
    p = f"{os.environ['OUT']}/trace-{m}.json"
    if not os.path.exists(p):
        continue
    t = json.load(open(p))["phases"]["ddtree63_trace"]
    print(m, {k: v for k, v in t.items() if not isinstance(v, (dict, list))})
    print("  by stage", {k: round(v["ms_per_step"], 3) for k, v in t["by_stage"].items()})
    for r in t["kernels"][:14]:
        print("  ", round(r["ms_per_step"], 4), round(r["gb_per_step"], 4), r["kernel"][:40], r["op_name"][:110])
PY
