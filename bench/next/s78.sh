#!/bin/bash
# Next GPU session, either card (~6 min; predictions in bench/NOTES.md "## Plan for the next GPU session"): the fused
# residual add + RMSNorm (pallas_kernels/add_rms_norm, opt-in JAXSPEC_ADD_RMS_NORM) against the default's two XLA
# kernels a norm (the add, and the norm's reduction with its scale deferred into the next product), where nothing
# drifts: the kernels' device time of verify(16), verify(64) (bench.verify_profile) and of the AR step at 1K
# (bench.harness --profile-steps), each with the flag unset and set.
#   OUT=... bash bench/next/s78.sh        (writes $OUT/s78.tgz)
#   dry run: CONFIG=tiny JAX_PLATFORMS=cpu PY=.venv/bin/python OUT=... bash bench/next/s78.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
PY=${PY:-python}
W=$(mktemp -d)
trap 'tar czf $OUT/s78.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | tee $W/gpu.txt
START=$SECONDS
for norm in reference pallas_triton; do
  [ $JAX_PLATFORMS = cpu ] && [ $norm = pallas_triton ] && norm=pallas_interpret
  mkdir -p $W/norm-$norm
  for spec in "16 chain" "64 tree"; do
    set -- $spec
    JAXSPEC_ADD_RMS_NORM=$norm timeout 120 $PY -m bench.verify_profile --config $CONFIG --nodes $1 \
      $([ $2 = tree ] && echo --tree) --out $W/norm-$norm > $W/norm-$norm/verify$1.log 2>&1
    echo "add_rms_norm=$norm, verify($1): rc=$? at $((SECONDS - START)) s"
  done
  JAXSPEC_ADD_RMS_NORM=$norm timeout 150 $PY -m bench.harness --config $CONFIG --contexts 1024 --prompt 0 \
    --iters 20 --ceiling-iters 3 --profile-steps 3 --out $W/norm-$norm/ar.json > $W/norm-$norm/ar.log 2>&1
  echo "add_rms_norm=$norm, AR step: rc=$? at $((SECONDS - START)) s"
done
for f in $W/norm-*/verify-*.json; do
  $PY -c "import json, sys; j = json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-2:], \
'kernels %.3f ms/step, %d kernels' % (j['kernel_ms_per_step'], j['kernels_per_step']))" $f
done
for f in $W/norm-*/ar.json; do
  $PY -c "import json, sys; d = json.load(open(sys.argv[1]))['decode'][0]; p = d['profile']; \
print(sys.argv[1].split('/')[-2], 'AR step at %d: kernels %.3f ms/step, %d kernels; step %.3f ms' \
% (d['context'], p['kernel_ms_per_step'], p['kernels_per_step'], d['step']['median_ms']))" $f
done
