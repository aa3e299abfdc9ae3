#!/bin/bash
# #6 (nvidia-h200, one call, ~2.5 min): the commit's GDN state update, one product for every layer (`batched`, the
# default) against one a layer (`JAXSPEC_COMMIT_STATES=per_layer`), by part with the optimized HLO.
# Session 44's commit profile (bench/results/2026-12-04-h200-s44/engine-commit/commit/): the batched product writes
# the updates U of all 48 layers (0.063 ms), then 48 fusions of ~4.6 us read U and S0 back and write S1 (~0.22 ms of
# the commit's 0.41). With a product a layer XLA may add e^G S0 in the product's epilogue and never write U.
# Predicted: if XLA fuses the epilogue, the state update 0.28 -> 0.12-0.18 ms (48 products of ~3 us, 6.3 MB each);
# if it does not, 48 products plus 48 fusions, 0.05-0.3 ms longer. Kept only if commit's kernels get shorter.
# Ran in session 44 (call 6) with JAXSPEC_COMMIT_STATES and states_at(per_layer=) in the tree; per_layer was
# slower (XLA did not fuse the epilogue) and both were reverted, so this script is the record of that call.
#   OUT=... bash bench/next/k_commit_states.sh     (writes $OUT/commit-states.tgz; CONFIG=tiny JAX_PLATFORMS=cpu
#   for a dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
save() { tar czf $OUT/commit-states.tgz -C $W .; }
for spec in "16 chain batched" "16 chain per_layer" "64 tree per_layer" "64 tree batched"; do
  set -- $spec
  JAXSPEC_COMMIT_STATES=$3 timeout 80 python -m bench.verify_profile --config $CONFIG --nodes $1 \
    $([ $2 = tree ] && echo --tree) --commit --hlo --out $W/$3 > $W/commit$1-$3.log 2>&1
  echo "commit after verify($1) $3 rc=$? at $((SECONDS - START)) s"
  grep -m2 "kernel_ms_per_step\|kernels_per_step" $W/commit$1-$3.log; save
done
