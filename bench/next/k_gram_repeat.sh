#!/bin/bash
# Ran in session 52 (bench/results/2026-12-05-h200-s52/gram-*): tests passed; means 20.67 (tree) against 20.75
# (ieee) ms: tf32x3 kept.
# #6 (nvidia-h200, two calls: PART=tests ~6.5 min, PART=rounds ~6.5 min): the tree delta rule's Gram product in
# three tf32 passes, the default since session 50 on one run each (DDTree(63) round 20.32 against 20.88 ms with fp32
# FMA tiles, DFlash 17.38 against 17.39; identical code spread 0.39 ms in DDTree(63) in that lease:
# bench/results/2026-12-05-h200-s50/).
#   PART=tests: the tree delta rule's GPU file (28 tests; tf32x3 is now what the default ones run) and the engine's
#     lossless GPU test with every kernel on. If either fails: `gram_precision="ieee"` back as the default.
#   PART=rounds: DDTree(63) rounds at 1K, alternating ieee / tree / ieee / tree (`_alt_ieee/`: the tree with the
#     fp32 Gram product as the default). Each run times the AR and drafter steps first and needs ~90 s at the real
#     shape (session 50's 70 s limit cut all four).
# Predicted: the tree 0.07-0.25 ms shorter in the mean of two (session 49's op bench: 46.2 against 47.6 us a layer at
# N = 64, ~0.07 ms a round). Keep tf32x3 unless its mean is longer than ieee's; if longer by > 0.1 ms, make "ieee"
# the default again.
#   PART=tests|rounds OUT=... bash bench/next/k_gram_repeat.sh   (writes into $OUT/gram-$PART/ as it goes;
#   CONFIG=tiny JAX_PLATFORMS=cpu PART=rounds is the dry run)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
PART=${PART:?PART=tests or PART=rounds}
CONFIG=${CONFIG:-real}
W=$OUT/gram-$PART; mkdir -p $W
START=$SECONDS
SRC=pallas_kernels/tree_delta_rule/pallas_triton.py
case $PART in
  tests)
    timeout 330 python -m pytest -q -rA -m gpu tests/test_tree_delta_rule_kernel.py -p no:cacheprovider \
      > $W/gpu-tests-tdr.log 2>&1
    echo "tree delta rule tests rc=$? at $((SECONDS - START)) s"; tail -1 $W/gpu-tests-tdr.log
    timeout 150 python -m pytest -q -rA -m gpu tests/test_kernels_engine.py -p no:cacheprovider \
      > $W/gpu-tests-engine.log 2>&1
    echo "engine tests rc=$? at $((SECONDS - START)) s"; tail -1 $W/gpu-tests-engine.log;;
  rounds)
    rm -rf _alt_ieee && mkdir _alt_ieee && cp -r jaxspec pallas_kernels bench convert pyproject.toml _alt_ieee/
    sed -i 's/gram_precision="tf32x3"):/gram_precision="ieee"):/' _alt_ieee/$SRC
    grep -q 'gram_precision="ieee"):' _alt_ieee/$SRC || { echo "_alt_ieee: default not set"; exit 2; }
    i=0
    for v in ieee tree ieee tree; do
      i=$((i + 1)); d=.; [ $v = ieee ] && d=_alt_ieee
      (cd $d && timeout 140 python -m bench.rounds --config $CONFIG --context 1024 --phases ddtree --rounds-only \
        --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$i-$v.json > $W/rounds-$i-$v.log 2>&1)
      echo "rounds $i $v rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-$i-$v.log | cut -c1-100
    done;;
  *) echo "PART=tests or PART=rounds"; exit 2;;
esac
