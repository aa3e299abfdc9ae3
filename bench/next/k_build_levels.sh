#!/bin/bash
# Ran in session 52 (bench/results/2026-12-05-h200-s52/build-levels/): build 0.558 -> 0.315 ms at B = 63,
# 0.448 -> 0.301 at B = 64: kept.
# #6 (nvidia-h200, one call, ~8 min): session 46's two unmeasured or partly measured changes, against _base/.
#   The caller makes _base/ first (the tree before the build change, same kernels):
#     mkdir _base && git archive 370c9b6 jaxspec pallas_kernels bench convert pyproject.toml ':!jaxspec/demo' \
#       ':!bench/results' ':!bench/next' | tar x -C _base
#   1. The tree build alone (bench.tree_build, B = 63 and 64, 12 longest kernels), _base/ then the tree.
#      cd9b723 counts the vocabulary's top-k in levels of at most 1024 entries (970 chunk maxima, 1008 sub-chunk
#      maxima, 1008 candidates: 3M comparisons a depth) where _base counted 3880 maxima and 4032 candidates (31M),
#      two reductions of ~87 and ~151 us a tree (bench/results/2026-12-04-h200-s46/call2-round-trace/).
#      On the 2-core CPU host (count forced) the build went 2143 -> 712 ms.
#      Predicted: build 0.57-0.59 -> 0.35-0.45 ms at B = 63 and 64.
#   2. The rounds at 1K (DDTree(63), DFlash), _base/ then the tree, one lease. Predicted: DDTree(63) 0.15-0.25 ms
#      shorter, DFlash unchanged (+-0.15). Since session 47 the tree also forms the tree delta rule's Gram products as
#      one product read in halves (k_tdr_keys_gram.sh's a, ~0.07 ms at DDTree(63)): subtract what that call measured.
#   3. The engine's lossless GPU test with every kernel on (the tree delta rule's GPU file runs in k_tdr_keys_gram.sh).
#   Since session 50 the tree also forms that product in three tf32 passes (20.88 -> 20.32 ms at DDTree(63) on one
#   run each) and samples without a sort (greedy unchanged): the rounds against _base/ mix those in. Run with
#   ROUNDS="" (the build alone decides, ~3.5 min) unless there is time to spare.
#   ROUNDS (default "base new") picks the rounds to time: "base" alone when the tree's rounds came from another call
#   of the same lease (k_tdr_keys_gram.sh PART=rounds), "" for none.
#   ENGINE_TESTS=0 skips 3 (when another call of the lease ran them).
#   OUT=... bash bench/next/k_build_levels.sh     (writes $OUT/build-levels.tgz; CONFIG=tiny JAX_PLATFORMS=cpu dry
#   run, which skips the GPU tests)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
save() { tar czf $OUT/build-levels.tgz -C $W .; }
trap save EXIT
[ -d _base ] || { echo "make _base/ first (see the script's header)"; exit 2; }
build() {  # NAME
  timeout 90 python -m bench.tree_build --budgets 63,64 --kernels 12 --out $W/build-$1.json > $W/build-$1.log 2>&1
  echo "build $1 rc=$? at $((SECONDS - START)) s"; grep "tree_build B=" $W/build-$1.log | cut -c1-120
}
rounds() {  # NAME
  timeout 150 python -m bench.rounds --config $CONFIG --context 1024 --phases ddtree,dflash --rounds-only \
    --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$1.json > $W/rounds-$1.log 2>&1
  echo "rounds $1 rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-$1.log | cut -c1-120
}
(cd _base && build base); build new; save
for r in ${ROUNDS-base new}; do if [ $r = base ]; then (cd _base && rounds base); else rounds new; fi; save; done
if [ "$JAX_PLATFORMS" != cpu ] && [ "${ENGINE_TESTS:-1}" = 1 ]; then
  timeout 110 python -m pytest -q -rA -m gpu tests/test_kernels_engine.py -p no:cacheprovider \
    > $W/gpu-tests-engine.log 2>&1
  echo "engine tests rc=$? at $((SECONDS - START)) s"; tail -2 $W/gpu-tests-engine.log
fi
