#!/bin/bash
# Session 78's second lease, for what is left of the budget (~325 s with the start): add_rms_norm in the deferred
# form (predictions in bench/NOTES.md "## Session 78"), in the order that matters if the budget cuts the call:
# verify(16) with the kernel, then with the default (the baseline on this machine), verify(64) and the AR step with
# the kernel (their defaults: the first lease, bench/results/2026-12-07-h100-s78/call1-s78), then its GPU tests.
#   OUT=... bash bench/next/s78b.sh        (writes $OUT/s78b.tgz)
#   dry run: CONFIG=tiny JAX_PLATFORMS=cpu PY=.venv/bin/python OUT=... bash bench/next/s78b.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
PY=${PY:-python}
KERNEL=pallas_triton
[ $JAX_PLATFORMS = cpu ] && KERNEL=pallas_interpret
W=$(mktemp -d)
trap 'tar czf $OUT/s78b.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | tee $W/gpu.txt
START=$SECONDS
verify() {   # verify NORM NODES [--tree]
  mkdir -p $W/norm-$1
  JAXSPEC_ADD_RMS_NORM=$1 timeout 100 $PY -m bench.verify_profile --config $CONFIG --nodes $2 $3 --out $W/norm-$1 \
    > $W/norm-$1/verify$2.log 2>&1
  echo "add_rms_norm=$1, verify($2): rc=$? at $((SECONDS - START)) s"
  for f in $W/norm-$1/verify-*$2.json; do
    [ -f $f ] && $PY -c "import json, sys; j = json.load(open(sys.argv[1])); k = [t for t in j['top_kernels'] \
if t['kernel'] == 'add_rms_norm']; print('  kernels %.3f ms/step, %d kernels' % (j['kernel_ms_per_step'], \
j['kernels_per_step']), *('; add_rms_norm %.3f ms in %d' % (t['ms_per_step'], t['count_per_step']) for t in k))" $f
  done
}
verify $KERNEL 16
verify reference 16
verify $KERNEL 64 --tree
JAXSPEC_ADD_RMS_NORM=$KERNEL timeout 100 $PY -m bench.harness --config $CONFIG --contexts 1024 --prompt 0 \
  --iters 20 --ceiling-iters 3 --profile-steps 3 --out $W/norm-$KERNEL/ar.json > $W/norm-$KERNEL/ar.log 2>&1
echo "add_rms_norm=$KERNEL, AR step: rc=$? at $((SECONDS - START)) s"; grep "profile" $W/norm-$KERNEL/ar.log
[ $JAX_PLATFORMS = cpu ] && exit 0
timeout 100 $PY -m pytest -q -rA -m gpu tests/test_add_rms_norm_kernel.py > $W/gpu-tests-add-rms-norm.log 2>&1
echo "add_rms_norm GPU tests rc=$? at $((SECONDS - START)) s"; tail -4 $W/gpu-tests-add-rms-norm.log
