#!/bin/bash
# Next GPU session, #6 (nvidia-h200, one call, ~3-4 min): why a tree of 65 nodes costs ~1.9 ms more to verify than
# one of 64. Session 21's rounds (budget 64: bench/results/2026-12-01-h200-s21-ar-loop) timed verify(65) at 22.83 ms
# of device time, session 17's (budget 63: bench/results/2026-12-01-h200-s17-verify) verify(64) at 20.94 ms, in two
# leases. Issue #6's goal is for 65 nodes (<= 1.20x the AR step; now 1.56x). The tree delta rule runs 65 nodes as 80
# rows (30.7 against 27.9 us a layer, ~0.13 ms over 48 layers), so it is not the bulk.
# Predicted: the difference sits in the gemms (cuBLAS picks another kernel for M = 65 than for M = 64, ~1.5 ms
# over the 64 layers' 7 weight matmuls) or in tree attention (65 queries: a second query tile); the by-part
# profiles of the two sizes, one lease, show which. Both at 1K context, a DDTree-shaped tree, 2 profiled calls.
# JAXSPEC_COMMIT=<hash> bash bench/next/k_v65.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kv65; mkdir -p $W
trap '(cd $W && tar czf $OUT/kv65.tgz .); grep -h "rc=" $W/*.log' EXIT
for n in 64 65; do
  timeout 200 python -m bench.verify_profile --config real --nodes $n --tree --out $W > $W/verify$n.log 2>&1
  echo "verify_profile nodes=$n rc=$?" >> $W/verify$n.log
done
python - <<'PY' > $W/compare.txt 2>&1
import json
a, b = (json.load(open(f"/tmp/kv65/verify-tree{n}.json")) for n in (64, 65))
print(f"kernel ms: 64 {a['kernel_ms_per_step']:.3f}  65 {b['kernel_ms_per_step']:.3f}")
for part in sorted(set(a["by_part"]) | set(b["by_part"])):
    x, y = (d["by_part"].get(part, {}).get("ms_per_step", 0.0) for d in (a, b))
    print(f"{part:12s} 64 {x:8.3f}  65 {y:8.3f}  diff {y - x:+.3f} ms")
PY
cat $W/compare.txt
