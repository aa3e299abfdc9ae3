#!/bin/bash
# #6 (nvidia-h200, two calls, ~6 + ~4 min): the GDN tree inputs kernel (pallas_kernels/gdn_tree_inputs), written in session
# 42 after its GPU time was spent; CPU-tested only (interpret mode, the Triton lowering for an abstract H200).
# Session 42's verify(16) profile (bench/results/2026-12-04-h200-s42/tdr-kernel/verify-new/): the GDN's non-product
# kernels took 1.57 ms a step, ~0.83 ms of it besides the delta rule's prepare and apply, in ~9 kernels a layer.
#   1. The kernel's GPU tests (real shape, bf16, N = 16, 64, 65, chains and trees), then its bench against XLA.
#   2. verify(16) and verify(64) by part with JAXSPEC_GDN_TREE_INPUTS=reference and =pallas_triton.
#   3. The engine's GPU tests: lossless with every kernel on (JAXSPEC_GDN_TREE_INPUTS=pallas_triton too), and at the
#      defaults (the model's GDN inputs now accumulate the conv in fp32: not yet run on a GPU).
# Session 43, call 2: the first form (48 programs over all N nodes) passed its GPU tests but took 14 / 67 us a layer
# at N = 16 / 64 in verify (+0.25 / +2.8 ms a step). Rewritten as a program per (channel group, 16 nodes): 80 / 320
# programs. Predicted for the second form: 3-5 us a layer at N = 16, 5-8 at N = 64 (XLA's kernels it replaces:
# ~8 / ~12 us); verify(16) 0.1-0.25 ms shorter, verify(64) 0.2-0.35 ms shorter.
# Session 42's prediction (first form): the op 5-8 us a layer on the device against ~17 us of XLA kernels; verify(16) 0.4-0.6 ms shorter,
# verify(64) 0.4-0.8 ms shorter. If so: make it the GPU default for 2..128 nodes, then time the rounds.
#   OUT=... bash bench/next/k_gdn_inputs.sh kernel   1 and 2 (writes $OUT/gdn-inputs-kernel.tgz)
#   OUT=... bash bench/next/k_gdn_inputs.sh engine   3 (writes $OUT/gdn-inputs-engine.tgz)
# CONFIG=tiny JAX_PLATFORMS=cpu for a dry run.
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
PART=$1
START=$SECONDS
case "$PART" in
  kernel)
    timeout 150 python -m pytest -q -rA -m gpu tests/test_gdn_tree_inputs_kernel.py -p no:cacheprovider \
      > $W/gpu-tests-inputs.log 2>&1
    echo "kernel tests rc=$? at $((SECONDS - START)) s"; tail -3 $W/gpu-tests-inputs.log
    timeout 90 python -m pallas_kernels.gdn_tree_inputs.bench --json $W/inputs-bench.json > $W/inputs-bench.log 2>&1
    echo "bench rc=$? at $((SECONDS - START)) s"; grep "N=" $W/inputs-bench.log | cut -c1-150
    for impl in reference pallas_triton; do
      for spec in "16 chain" "64 tree"; do
        set -- $spec
        JAXSPEC_GDN_TREE_INPUTS=$impl timeout 70 python -m bench.verify_profile --config $CONFIG --nodes $1 \
          $([ $2 = tree ] && echo --tree) --out $W/verify-$impl > $W/verify$1-$impl.log 2>&1
        echo "verify($1) $impl rc=$? at $((SECONDS - START)) s"
        grep -m3 "kernel_ms_per_step\|gemm_ms_per_step\|other_kernels" $W/verify$1-$impl.log
      done
    done;;
  engine)
    timeout 560 python -m pytest -q -rA -m gpu tests/test_kernels_engine.py tests/test_engine.py -p no:cacheprovider \
      > $W/gpu-tests-engine.log 2>&1
    echo "engine tests rc=$? at $((SECONDS - START)) s"; tail -4 $W/gpu-tests-engine.log;;
  *) echo "usage: bash bench/next/k_gdn_inputs.sh kernel | engine"; exit 2;;
esac
tar czf $OUT/gdn-inputs-$PART.tgz -C $W .
