#!/bin/bash
# #6 (nvidia-h200, one call, ~9 min): session 46's tree delta rule, first GPU run. Session 46's round trace found the
# rule at 58.5 us a layer inside a DDTree(63) verify (prepare 25.8, apply 21.5, Gram products 11.4) where the op bench
# said 27.4: the bench let XLA compute prepare and the Gram products once for its 48 stacked layers (fixed). The change:
# the 16 x 16 tile inverse by recursive doubling (6 dots) instead of forward substitution (15 steps of two
# reductions); apply reads Tb's and M's rows whole (one dot per power-of-two segment of the nodes) with the key chunks
# unrolled, instead of a loop over tiles inside a loop over key chunks.
#   1. the tree delta rule's GPU tests; 2. the rounds at 1K (DFlash, DDTree(63)) with the change, then from _base/
#   (the tree before it, made by the caller: git archive of the parent commit); 3. the engine's lossless GPU test
#   with every kernel on; 4. the op bench (fixed) at N = 16, 64, 65.
# Predicted: prepare 8.1 -> 5-6.5 us a layer at N = 16 and 25.8 -> 13-18 at N = 64; apply 21.5 -> 8-12 at N = 64;
# the DDTree(63) round 0.6-1.2 ms shorter, the DFlash round 0.05-0.2 shorter (within one lease's noise).
#   OUT=... bash bench/next/k_tdr_apply.sh      (writes $OUT/tdr-apply.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
save() { tar czf $OUT/tdr-apply.tgz -C $W .; }
trap save EXIT
rounds() {  # NAME: the rounds at 1K from the current directory
  timeout 170 python -m bench.rounds --config $CONFIG --context 1024 --phases dflash,ddtree --rounds-only \
    --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$1.json > $W/rounds-$1.log 2>&1
  echo "rounds $1 rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-$1.log | cut -c1-200
}
if [ "$JAX_PLATFORMS" != cpu ]; then
  timeout 170 python -m pytest -q -rA -m gpu tests/test_tree_delta_rule_kernel.py -p no:cacheprovider \
    > $W/gpu-tests-tdr.log 2>&1
  echo "tdr tests rc=$? at $((SECONDS - START)) s"; tail -2 $W/gpu-tests-tdr.log
fi
rounds new; save
(cd _base && PYTHONPATH=. rounds base); save
if [ "$JAX_PLATFORMS" != cpu ]; then
  timeout 130 python -m pytest -q -rA -m gpu tests/test_kernels_engine.py -p no:cacheprovider \
    > $W/gpu-tests-engine.log 2>&1
  echo "engine tests rc=$? at $((SECONDS - START)) s"; tail -2 $W/gpu-tests-engine.log; save
  timeout 90 python -m pallas_kernels.tree_delta_rule.bench --sizes 16,64,65 --impls pallas_triton \
    --json $W/bench.json > $W/bench.log 2>&1
  echo "bench rc=$? at $((SECONDS - START)) s"; grep "N=" $W/bench.log | cut -c1-150
fi
