#!/bin/bash
# #6 (nvidia-h200, one call, ~8 min): sampled top-p-alone rounds with and without the nucleus_mass kernel.
# Session 55 (H100, bench/results/2026-12-05-h100-s55/): top-p alone (0.7,0,0.9) cost a DDTree(63) round 1.60 ms over
# greedy, the threshold search alone 0.37 + 1.23 ms (the drafter's 15 rows, the target's 64); with
# pallas_kernels/nucleus_mass (opt-in, JAXSPEC_NUCLEUS_MASS=pallas_triton) the search took 0.26 + 0.81 ms.
#   The rounds at 1K, real shape, random bf16 weights, one lease, in the order reference / kernel / reference /
#   kernel, then the kernel's GPU tests. Predicted (written in session 55): the kernel shortens the DDTree(63) round by
#   0.4-0.6 ms, DFlash (15 + 16 rows) by 0.2-0.3, the AR loop (1 row) by <= 0.1. Make `pallas_triton` the op's GPU
#   default (pallas_kernels/nucleus_mass/api.py `resolve`) if DDTree(63) is >= 0.2 ms shorter on the means of two and
#   neither other loop is longer by more than 0.1.
#   OUT=... bash bench/next/k_nucleus_rounds.sh     (writes $OUT/nucleus-rounds.tgz; a dry run on a CPU, ~8 min:
#   CONFIG=tiny JAX_PLATFORMS=cpu KERNEL=pallas_interpret, with the venv's python first in PATH)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=${W:-$(mktemp -d)}; mkdir -p $W   # W=$OUT/...: the logs land where a cut-off call still returns them
START=$SECONDS
trap 'tar czf $OUT/nucleus-rounds.tgz -C $W .' EXIT
rounds() {  # NAME IMPLEMENTATION
  JAXSPEC_NUCLEUS_MASS=$2 timeout 150 python -m bench.rounds --config $CONFIG --context 1024 \
    --phases ar,ddtree,dflash --rounds-only --budgets 63 --round-budget 63 --ar-rounds 20 --max-len 8192 \
    --sampling 0.7,0,0.9 --out $W/rounds-$1.json > $W/rounds-$1.log 2>&1
  echo "rounds $1 rc=$? at $((SECONDS - START)) s"; grep -E "_round(_device_loop)? " $W/rounds-$1.log | cut -c1-120
}
rounds 1-reference reference
rounds 2-kernel ${KERNEL:-pallas_triton}
rounds 3-reference reference
rounds 4-kernel ${KERNEL:-pallas_triton}
if [ "$JAX_PLATFORMS" != cpu ]; then
  timeout 60 python -m pytest -q -rA -p no:cacheprovider tests/test_nucleus_mass_kernel.py -m gpu \
    > $W/gpu-tests-nucleus-mass.log 2>&1
  echo "nucleus_mass GPU tests rc=$? at $((SECONDS - START)) s"; tail -1 $W/gpu-tests-nucleus-mass.log
fi
