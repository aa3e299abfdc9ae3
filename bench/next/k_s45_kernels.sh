#!/bin/bash
# Record only: the flags it sets were removed with their code (bench/NOTES.md, sessions 44-46), and jaxspec now
# refuses unknown JAXSPEC_* variables (pallas_kernels/dispatch.py FLAGS), so it no longer runs.
# #6 (nvidia-h200, one call, ~7 min): session 45's second look at session 44's two opt-in kernels, after their
# first GPU run this session (bench/results/2026-12-04-h200-s45/README.md):
#   - state_update (dot form) took 59.5 / 515.6 / 1192.2 us a layer on the device at N = 16 / 64 / 65 against the
#     reference's 5.1 / 9.3 / 13.2. The path form (new) loops over the accepted path's nodes only, a rank-1 fp32
#     update each. Predicted: the path form 3-6 us a layer at every N (the S0 / S1 tiles, 6.3 MB, dominate; a path
#     of <= 16 nodes costs <= 16 x 128 x 64 FMAs a program). The sweep says which tile / warps, and whether the dot
#     form was slow for its tile (register spills) or for its form.
#   - tree attention's min_split_keys lost at 32K (217.6 against 144.0 us a layer, wall-clock) because its combine
#     kernel ran one program per kv head and row block (8 at N = 16). The combine now runs a program per 16 rows x
#     64 columns (128 at N = 16). The bench now reports device time (at 1K the wall-clock was the host's).
#     Predicted: at 32K min256 within +-5 us of the default on the device; at 1K / N = 16 min256 6-10 us shorter.
#   1. state_update GPU tests (both forms), then its bench with the sweep.
#   2. tree attention bench at 1K / 32K, N = 16 / 64: default, splits 8 / 16, min_split_keys 32 / 128 / 256 / 512.
#   3. tree attention's min_split_keys GPU tests.
#   4. accept + commit by part after verify(16) and a DDTree verify(64) with the path form.
#   OUT=... bash bench/next/k_s45_kernels.sh    (writes $OUT/s45-kernels.tgz; CONFIG=tiny JAX_PLATFORMS=cpu dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
save() { tar czf $OUT/s45-kernels.tgz -C $W .; }
if [ "$JAX_PLATFORMS" != cpu ]; then
  timeout 150 python -m pytest -q -rA -m gpu tests/test_state_update_kernel.py -p no:cacheprovider \
    > $W/gpu-tests-state-update.log 2>&1
  echo "state_update tests rc=$? at $((SECONDS - START)) s"; tail -2 $W/gpu-tests-state-update.log
  timeout 150 python -m pallas_kernels.state_update.bench --json $W/state-update-bench.json \
    > $W/state-update-bench.log 2>&1
  echo "state_update bench rc=$? at $((SECONDS - START)) s"; grep "N=" $W/state-update-bench.log | cut -c1-100; save
  timeout 150 python -m pallas_kernels.tree_attention.bench --prefixes 1024,32768 --sizes 16,64 --no-reference \
    --splits 8,16 --min-split-keys 32,128,256,512 --json $W/attn-splits.json > $W/attn-splits.log 2>&1
  echo "attention bench rc=$? at $((SECONDS - START)) s"; grep "prefix" $W/attn-splits.log | cut -c1-100; save
  timeout 120 python -m pytest -q -rA -m gpu tests/test_tree_attention_kernel.py -k min_split_keys \
    -p no:cacheprovider > $W/gpu-tests-min-split.log 2>&1
  echo "min_split tests rc=$? at $((SECONDS - START)) s"; tail -2 $W/gpu-tests-min-split.log; save
fi
KERNEL=pallas_triton; [ "$JAX_PLATFORMS" = cpu ] && KERNEL=pallas_interpret
for spec in "16 chain" "64 tree"; do
  set -- $spec
  JAXSPEC_STATE_UPDATE=$KERNEL timeout 80 python -m bench.verify_profile --config $CONFIG --nodes $1 \
    $([ $2 = tree ] && echo --tree) --commit --out $W/commit-$KERNEL > $W/commit$1-$KERNEL.log 2>&1
  echo "commit after verify($1) $KERNEL rc=$? at $((SECONDS - START)) s"
  grep -m2 "kernel_ms_per_step\|kernels_per_step" $W/commit$1-$KERNEL.log; save
done
