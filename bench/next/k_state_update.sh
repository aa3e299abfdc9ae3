#!/bin/bash
# Record only: the flags it sets were removed with their code (bench/NOTES.md, sessions 44-46), and jaxspec now
# refuses unknown JAXSPEC_* variables (pallas_kernels/dispatch.py FLAGS), so it no longer runs.
# #6 (nvidia-h200, one call, ~6 min): the commit's GDN state update as a kernel a layer (pallas_kernels/state_update),
# written in session 44 after its GPU time was spent; CPU-tested only (interpret mode, the Triton lowering for an
# abstract H200, per shard under a mesh, the engine with it interpreted).
# Session 44's commit profile (bench/results/2026-12-04-h200-s44/engine-commit/commit/): one product writes every
# layer's update U (0.063 ms), then 48 fusions of ~4.6 us read U and S0 and write S1 (~0.22 ms), plus the stacks
# feeding the product (~0.03 ms): ~0.31 of the commit's 0.42 ms after verify(16) (0.50 after a DDTree verify(64)).
#   1. The kernel's GPU tests (real shape, N = 16 / 64 / 65), then its bench against the reference one layer at a
#      time (48 layers in one jit).
#   2. accept + commit by part after verify(16) and after a DDTree verify(64), JAXSPEC_STATE_UPDATE=reference and
#      =pallas_triton, with the optimized HLO.
#   3. The engine's GPU tests with every kernel on (this one included): lossless against greedy AR.
# Predicted: the op 3-4.5 us a layer (6.3 MB at 1.5-2 TB/s); commit after verify(16) 0.42 -> 0.27-0.33 ms and after
# verify(64) 0.50 -> 0.33-0.40 (48 kernels fewer, no U). If commit's kernels get >= 0.08 ms shorter at both: make it
# the GPU default, then the rounds in one lease: bash bench/next/k_rounds_ab.sh "JAXSPEC_STATE_UPDATE=reference" ""
# (predicted 0.08-0.15 ms shorter a round).
#   OUT=... bash bench/next/k_state_update.sh     (writes $OUT/state-update.tgz; CONFIG=tiny JAX_PLATFORMS=cpu for a
#   dry run, which skips the GPU tests)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
save() { tar czf $OUT/state-update.tgz -C $W .; }
if [ "$JAX_PLATFORMS" != cpu ]; then
  timeout 120 python -m pytest -q -rA -m gpu tests/test_state_update_kernel.py -p no:cacheprovider \
    > $W/gpu-tests-state-update.log 2>&1
  echo "kernel tests rc=$? at $((SECONDS - START)) s"; tail -3 $W/gpu-tests-state-update.log
  timeout 120 python -m pallas_kernels.state_update.bench --json $W/bench.json > $W/bench.log 2>&1
  echo "bench rc=$? at $((SECONDS - START)) s"; grep "N=" $W/bench.log | cut -c1-150; save
fi
KERNEL=pallas_triton; [ "$JAX_PLATFORMS" = cpu ] && KERNEL=pallas_interpret
for impl in reference $KERNEL; do
  for spec in "16 chain" "64 tree"; do
    set -- $spec
    JAXSPEC_STATE_UPDATE=$impl timeout 80 python -m bench.verify_profile --config $CONFIG --nodes $1 \
      $([ $2 = tree ] && echo --tree) --commit --hlo --out $W/commit-$impl > $W/commit$1-$impl.log 2>&1
    echo "commit after verify($1) $impl rc=$? at $((SECONDS - START)) s"
    grep -m2 "kernel_ms_per_step\|kernels_per_step" $W/commit$1-$impl.log; save
  done
done
if [ "$JAX_PLATFORMS" != cpu ]; then
  timeout $((570 - (SECONDS - START))) python -m pytest -q -rA -m gpu tests/test_kernels_engine.py -p no:cacheprovider \
    > $W/gpu-tests-engine.log 2>&1
  echo "engine tests rc=$? at $((SECONDS - START)) s"; tail -3 $W/gpu-tests-engine.log; save
fi
