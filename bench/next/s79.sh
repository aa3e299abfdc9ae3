#!/bin/bash
# Next GPU session, either card (~6 min; predictions in bench/NOTES.md "## Session 79"): add_rms_norm in the deferred
# form (outputs x + u, h and the row scale, as the default path) taking the products' K slices (session 79: the model
# hands them over where the kernel runs), never yet on a GPU. In kernels' device time at 1K, the flag set and unset:
# verify(16), verify(64) (bench.verify_profile), the op's bench (127 calls at 1 / 16 / 64 rows, a whole update), the AR
# step (bench.harness --profile-steps), then the kernel's GPU tests.
#   OUT=... bash bench/next/s79.sh        (writes $OUT/s79.tgz)
#   dry run: CONFIG=tiny JAX_PLATFORMS=cpu PY=.venv/bin/python OUT=... bash bench/next/s79.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
PY=${PY:-python}
KERNEL=pallas_triton
[ $JAX_PLATFORMS = cpu ] && KERNEL=pallas_interpret
W=$(mktemp -d)
trap 'tar czf $OUT/s79.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | tee $W/gpu.txt
START=$SECONDS
verify() {   # verify NORM NODES [--tree]
  mkdir -p $W/norm-$1
  JAXSPEC_ADD_RMS_NORM=$1 timeout 120 $PY -m bench.verify_profile --config $CONFIG --nodes $2 $3 --out $W/norm-$1 \
    > $W/norm-$1/verify$2.log 2>&1
  echo "add_rms_norm=$1, verify($2): rc=$? at $((SECONDS - START)) s"
  for f in $W/norm-$1/verify-*$2.json; do
    [ -f $f ] && $PY -c "import json, sys; j = json.load(open(sys.argv[1])); k = [t for t in j['top_kernels'] \
if t['kernel'] == 'add_rms_norm']; print('  kernels %.3f ms/step, %d kernels' % (j['kernel_ms_per_step'], \
j['kernels_per_step']), *('; add_rms_norm %.3f ms in %d' % (t['ms_per_step'], t['count_per_step']) for t in k))" $f
  done
}
ar() {   # ar NORM
  JAXSPEC_ADD_RMS_NORM=$1 timeout 150 $PY -m bench.harness --config $CONFIG --contexts 1024 --prompt 0 \
    --iters 20 --ceiling-iters 3 --profile-steps 3 --out $W/norm-$1/ar.json > $W/norm-$1/ar.log 2>&1
  echo "add_rms_norm=$1, AR step: rc=$? at $((SECONDS - START)) s"; grep "profile" $W/norm-$1/ar.log
}
verify $KERNEL 16
verify reference 16
verify $KERNEL 64 --tree
verify reference 64 --tree
timeout 120 $PY -m pallas_kernels.add_rms_norm.bench $([ $JAX_PLATFORMS = cpu ] && echo --layers 3 --iters 1) \
  --json $W/add_rms_norm_bench.json > $W/add_rms_norm_bench.log 2>&1
echo "add_rms_norm bench rc=$? at $((SECONDS - START)) s"; tail -9 $W/add_rms_norm_bench.log
ar $KERNEL
ar reference
[ $JAX_PLATFORMS = cpu ] && exit 0
timeout 100 $PY -m pytest -q -rA -m gpu tests/test_add_rms_norm_kernel.py > $W/gpu-tests-add-rms-norm.log 2>&1
echo "add_rms_norm GPU tests rc=$? at $((SECONDS - START)) s"; tail -4 $W/gpu-tests-add-rms-norm.log
