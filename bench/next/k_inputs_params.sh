#!/bin/bash
# #6 (nvidia-h200, one call, ~6 min): the GDN tree inputs kernel reads A_log and dt_bias itself (session 44).
# Session 44's verify(16) profile (bench/results/2026-12-04-h200-s44/gdn-norm/verify-reference/): XLA stacked A_log and
# dt_bias into one fp32 [Hv, 2] array per GDN layer for the kernel, a kernel a layer (input_concatenate_fusion_3,
# 48 a step, 0.062 ms, 1.3 us each for 384 bytes). The kernel now takes both [Hv] vectors as one-element blocks.
#   1. gdn_tree_inputs' GPU tests (real shape, bf16, N = 16, 64, 65).
#   2. verify(16) and verify(64) by part, with the optimized HLO written beside each JSON (--hlo: to read which
#      ops the GDN layers' remaining small fusions compute).
#   3. The DFlash and DDTree(63) rounds at 1K, the commit before (_base/, run from inside it) against this tree.
# Predicted: 48 kernels fewer a verify step (1192 -> 1144 at N = 16), the stack kernel gone; verify(16) and verify(64)
# 0.04-0.07 ms shorter; the rounds 0.03-0.08 ms shorter (at the edge of one lease's noise, ~0.05 ms).
# _base/ is `git archive` of the commit before (jaxspec, pallas_kernels, bench, convert), not committed.
#   OUT=... bash bench/next/k_inputs_params.sh     (writes $OUT/inputs-params.tgz; CONFIG=tiny JAX_PLATFORMS=cpu
#   for a dry run)
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
ROOT=$PWD
W=$(mktemp -d)
START=$SECONDS
trap 'tar czf $OUT/inputs-params.tgz -C $W .' EXIT
export PYTHONPATH=.
if [ "$JAX_PLATFORMS" != cpu ]; then
  timeout 120 python -m pytest -q -rA -m gpu tests/test_gdn_tree_inputs_kernel.py -p no:cacheprovider \
    > $W/gpu-tests-inputs.log 2>&1
  echo "kernel tests rc=$? at $((SECONDS - START)) s"; tail -3 $W/gpu-tests-inputs.log
fi
for spec in "16 chain" "64 tree"; do
  set -- $spec
  timeout 80 python -m bench.verify_profile --config $CONFIG --nodes $1 $([ $2 = tree ] && echo --tree) --hlo \
    --out $W/verify > $W/verify$1.log 2>&1
  echo "verify($1) rc=$? at $((SECONDS - START)) s"
  grep -m4 "kernel_ms_per_step\|kernels_per_step\|gemm_ms_per_step\|other_kernels" $W/verify$1.log
done
for side in _base .; do
  tag=$([ $side = . ] && echo new || echo base)
  (cd $ROOT/$side && timeout 170 python -m bench.rounds --config $CONFIG --context 1024 --phases dflash,ddtree \
    --rounds-only --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$tag.json > $W/rounds-$tag.log 2>&1)
  echo "rounds $tag rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-$tag.log | cut -c1-200
done
