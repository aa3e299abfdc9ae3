#!/bin/bash
# Ran in session 44 (bench/results/2026-12-04-h200-s44/gdn-norm/): the kernel was slower than XLA and was removed, so
# this script is the record of that call.
# #6 (nvidia-h200, one call, ~6 min): the GDN output gate kernel (pallas_kernels/gdn_gated_norm), written in session 43
# after its GPU time was spent; CPU-tested only (interpret mode, the Triton lowering for an abstract H200).
# Session 43's verify(16) profile with the GDN tree inputs kernel on (bench/results/2026-12-04-h200-s43/
# inputs-second-form/verify-pallas_triton/): after the tree delta rule, XLA runs three small kernels a GDN layer for
# RMSNorm(o) * silu(z) (loop_convert_fusion_47 0.103, triton_softmax_159 0.071, loop_convert_fusion_95 0.081 ms a
# step, 48 each; which kernel is which is read from their op names, not proven).
#   1. The kernel's GPU tests (real shape, bf16 y, N = 16, 64, 65), then its bench against XLA.
#   2. verify(16) and verify(64) by part with JAXSPEC_GDN_GATED_NORM=reference and =pallas_triton.
#   3. The engine's GPU test with every kernel on (this one included): lossless against greedy AR.
# At verify(64) the same three kernels take 0.187 + 0.096 + 0.082 ms (fusion_2882 is the norm's multiply there).
# Predicted: the op 1.5-2.5 us a layer on the device; verify(16) 0.1-0.2 ms shorter, verify(64) 0.15-0.3 ms
# shorter (three kernels a layer become one). If so: make it the GPU default, then time the rounds against the reference in one
# lease (bench.rounds ... --phases dflash,ddtree --rounds-only with the flag at each value).
#   OUT=... bash bench/next/k_gdn_norm.sh     (writes $OUT/gdn-norm.tgz; CONFIG=tiny JAX_PLATFORMS=cpu for a dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
trap 'tar czf $OUT/gdn-norm.tgz -C $W .' EXIT
timeout 120 python -m pytest -q -rA -m gpu tests/test_gdn_gated_norm_kernel.py -p no:cacheprovider \
  > $W/gpu-tests-norm.log 2>&1
echo "kernel tests rc=$? at $((SECONDS - START)) s"; tail -3 $W/gpu-tests-norm.log
timeout 90 python -m pallas_kernels.gdn_gated_norm.bench --json $W/norm-bench.json > $W/norm-bench.log 2>&1
echo "bench rc=$? at $((SECONDS - START)) s"; grep "N=" $W/norm-bench.log | cut -c1-150
for impl in reference pallas_triton; do
  for spec in "16 chain" "64 tree"; do
    set -- $spec
    JAXSPEC_GDN_GATED_NORM=$impl timeout 70 python -m bench.verify_profile --config $CONFIG --nodes $1 \
      $([ $2 = tree ] && echo --tree) --out $W/verify-$impl > $W/verify$1-$impl.log 2>&1
    echo "verify($1) $impl rc=$? at $((SECONDS - START)) s"
    grep -m3 "kernel_ms_per_step\|gemm_ms_per_step\|other_kernels" $W/verify$1-$impl.log
  done
done
timeout $((570 - (SECONDS - START))) python -m pytest -q -rA -m gpu tests/test_kernels_engine.py -p no:cacheprovider \
  > $W/gpu-tests-engine.log 2>&1
echo "engine tests rc=$? at $((SECONDS - START)) s"; tail -3 $W/gpu-tests-engine.log
