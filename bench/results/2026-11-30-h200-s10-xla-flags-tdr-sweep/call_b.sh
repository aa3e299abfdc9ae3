#!/bin/bash
# nvidia-h200, session 10, call B (#6): XLA's gemm choices for the 65-row verify (16 layers, device-loop rounds
# with profiles) under autotuning flags; the tree delta rule's tf32x3 sweep.
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
mkdir -p /tmp/b
trap '(cd /tmp/b && tar czf $OUT/b.tgz .); grep -h "kernels/round\|rc=" /tmp/b/*.log; grep -h "N=" /tmp/b/tdr.log' EXIT
date +%s > /tmp/b/t0
analyse() {  # $1 xplane, $2 rounds traced
python - "$1" "$2" <<'PY'
import sys, collections
from bench.profile import load_events
ev, _ = load_events(sys.argv[1]); n = int(sys.argv[2])
busy = sum(e[1] for e in ev); span = ev[-1][0] + ev[-1][1] - ev[0][0]
print(f"{sys.argv[1]}: {len(ev)/n:.0f} kernels/round, kernels {busy/n/1e6:.3f} ms/round, span {span/n/1e6:.3f} ms/round, busy {busy/span:.1%}")
by = collections.Counter()
for e in ev: by[e[2]] += e[1]
for k, v in by.most_common(12): print(f"   {v/n/1e3:9.1f} us/round  {k[:110]}")
PY
}
i=0
for flags in "" "--xla_gpu_exhaustive_tiling_search=true" "--xla_gpu_exhaustive_tiling_search=true --xla_gpu_cublas_fallback=false"; do
  i=$((i+1))
  XLA_FLAGS="$flags" JAX_PLATFORMS=cuda timeout 150 python -m bench.tp --config real --tp 1 --layers 16 --contexts 1024 \
    --skip-identity --methods ar,dflash,ddtree64 --rounds 16 --profile /tmp/b/prof_$i --out /tmp/b/tp16_$i.json \
    > /tmp/b/tp16_$i.log 2>&1; echo "tp16 $i [$flags] rc=$?" >> /tmp/b/tp16_$i.log
  for f in /tmp/b/prof_$i/*.xplane.pb; do analyse $f 32 >> /tmp/b/tp16_$i.log 2>&1; done
  echo "elapsed $(( $(date +%s) - $(cat /tmp/b/t0) )) s"
done
JAX_PLATFORMS=cuda timeout 150 python -m pallas_kernels.tree_delta_rule.bench --sizes 16,65 --sweep --json /tmp/b/tdr.json > /tmp/b/tdr.log 2>&1
echo "tdr rc=$?" >> /tmp/b/tdr.log
echo "elapsed $(( $(date +%s) - $(cat /tmp/b/t0) )) s"
