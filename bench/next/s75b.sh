#!/bin/bash
# Session 75's second call (either card, ~5 min): k_commit_fused.py's forms that compile in reasonable time (the
# prototype, since removed: `git show a18473d:bench/next/k_commit_fused.py`; now pallas_kernels/gdn_commit). The
# first call (s75.sh) showed "fma" (unrolled) at 207.6 us against XLA's 343.4 on an H100, but 314 s to compile.
#   OUT=... bash bench/next/s75b.sh     (writes $OUT/a/commit_fused.json, $OUT/b/commit_fused.json and logs)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
PY=${PY:-python}
TINY=${TINY:-}
mkdir -p $OUT/a $OUT/b
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt 2>/dev/null
START=$SECONDS
show() { $PY - $1/commit_fused.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["case"], r["variant"], r.get("error") or f"{r['device_us']:.1f} us, {r['kernels']:.0f} kernels, "
          f"err {r['rel_err']:.1e}, compile {r['compile_s']:.1f} s")
PY
}
timeout 330 $PY bench/next/k_commit_fused.py $TINY --forms tf32x3,fma_loop --pers 1,4 --bdvs 32,64 --out $OUT/a \
  > $OUT/a/log 2>&1
echo "tf32x3 / fma_loop rc=$? at $((SECONDS - START)) s"; show $OUT/a
timeout $((540 - (SECONDS - START))) $PY bench/next/k_commit_fused.py $TINY --forms ieee --pers 1 --bdvs 32 \
  --out $OUT/b > $OUT/b/log 2>&1
echo "ieee rc=$? at $((SECONDS - START)) s"; show $OUT/b
