#!/bin/bash
# nvidia-h200, session 10, call A (#6): the 1K rounds table at the current code, and whether the DDTree
# round is host-bound (16-layer device-loop trace: kernel time vs wall per round; command buffers).
export PYTHONPATH=. PYTHONUNBUFFERED=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1
mkdir -p /tmp/a
trap '(cd /tmp/a && tar czf $OUT/a.tgz --exclude="*.xplane.pb" . ; tar czf $OUT/a_xplane.tgz $(find . -name "*.xplane.pb")); tail -3 /tmp/a/*.log; cat /tmp/a/t/table.md 2>/dev/null' EXIT
date +%s > /tmp/a/t0
JAX_PLATFORMS=cuda timeout 320 python -m bench.table --config real --contexts 1024 --parts rounds \
  --deadline-s 310 --out /tmp/a/t > /tmp/a/table.log 2>&1; echo "table rc=$?" >> /tmp/a/table.log
analyse() {  # $1 xplane, $2 rounds traced
python - "$1" "$2" <<'PY'
import sys
from bench.profile import load_events
ev, _ = load_events(sys.argv[1]); n = int(sys.argv[2])
busy = sum(e[1] for e in ev); span = ev[-1][0] + ev[-1][1] - ev[0][0]
print(f"{sys.argv[1]}: {len(ev)/n:.0f} kernels/round, kernels {busy/n/1e6:.3f} ms/round, span {span/n/1e6:.3f} ms/round, busy {busy/span:.1%}")
PY
}
for flags in "" "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,WHILE,CONDITIONAL"; do
  tag=$([ -z "$flags" ] && echo plain || echo cmdbuf)
  XLA_FLAGS="$flags" JAX_PLATFORMS=cuda timeout 130 python -m bench.tp --config real --tp 1 --layers 16 --contexts 1024 \
    --skip-identity --methods ar,dflash,ddtree64 --rounds 16 --profile /tmp/a/prof_$tag --out /tmp/a/tp16_$tag.json \
    > /tmp/a/tp16_$tag.log 2>&1; echo "tp16 $tag rc=$?" >> /tmp/a/tp16_$tag.log
  for f in /tmp/a/prof_$tag/*.xplane.pb; do analyse $f 32 >> /tmp/a/tp16_$tag.log 2>&1; done
done
echo "elapsed $(( $(date +%s) - $(cat /tmp/a/t0) )) s"
