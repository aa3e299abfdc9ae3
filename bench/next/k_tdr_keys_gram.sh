#!/bin/bash
# #6 (nvidia-h200, two calls: PART=ops ~8.5 min (its limits: 170 + 330 s), then PART=rounds ~5 min): session 47's
# tree delta rule changes (CPU-tested only: interpret mode and the Triton lowering).
#   a. The Gram products as the one product XLA already made of them, [Q; K] K^T, read in halves by the kernels:
#      the slice after it goes (1.4 us a layer at N = 64 in session 46's round). On by default.
#   b. `gram_precision="tf32x3"` for that product (opt-in): in fp32 XLA ran it as 8.5 us of FMA tiles a layer.
#   c. `split_keys` (opt-in): W = Tb E K and U = E Q - M E K in `_keys_kernel`, a program per tile and key chunk.
#      In session 46's round the apply took 21.5 us a layer at N = 64: the last tile's program runs 4 key chunks in
#      sequence, each with a loop over the 4 tiles j <= i (~24 dependent load + dot steps); split, <= 4 + 8 steps,
#      one launch more and a 2 x 1.5 MB round trip a layer.
#   d. `one_kernel` (opt-in, one tile: the DFlash block of 16): prepare and apply as one kernel. Session 46's DFlash
#      round: prepare 8.1 + apply 6.8 us a layer, one after the other.
# PART=ops:
#   1. The op bench (each layer depends on the last), N = 16 / 64 / 65: the default, b, c (key chunks 32 and 64), d,
#      and session 43's opt-in `split_m` (no gain then, 27.6 / 29.9 against 27.4 / 30.1 us at N = 64 / 65; with the
#      faster tile inverse its share may differ). Unless split_m now beats the default by >= 2 us at N = 64, remove it
#      (`_mix_kernel`, the keyword, its tests and bench row).
#      Predicted, us a layer: the default 19.2 / 49-50.5 / 59-60 (a; session 46: 19.2 / 51.1 / 60.6); b 19.2 /
#      45-48 / 55-58; c 18-22 / 40-46 / 48-55; d (N = 16 only) 15-18.
#   2. The tree delta rule's GPU test file in full (b987f00's tile inverse and a have not run it; b-d have tests).
# PART=rounds: the rounds at 1K (DDTree(63), DFlash), one lease: the tree, then copies with b, c, d on by default
#   (_alt_gram/, _alt_one/; _alt_keys/ until session 49). Predicted against the tree: b DDTree(63) 0.1-0.25 ms
#   shorter, DFlash the same (one tile keeps the Gram dots inside); c DDTree(63) 0.3-0.5 shorter, DFlash +-0.15;
#   d DFlash 0.05-0.15 shorter, DDTree(63) the same.
# Keep what shortens its round by >= 0.15 ms without lengthening the other by more than 0.1 (c: by default only for
# blocks of more than one tile unless N = 16 wins too), then remove the flags and code paths that lost, with the
# numbers in the docstring. If a's GPU tests fail, revert a (the two einsums and the slice come back).
# VARIANTS (PART=rounds; default "gram one") names the copies to time after the tree, e.g. only those whose
# op bench won.
# Session 49 ran PART=ops (bench/results/2026-12-05-h200-s49/call1-tdr-ops/: a's tests passed; device us a layer at
# N = 16 / 64 / 65: default 19.2 / 47.6 / 57.5, b 19.3 / 46.2 / 57.3, c 20.0 / 46.6 / 58.9, d 18.1 at 16, split_m
# 22.3 / 51.7 / 59.0) and removed c and split_m. Session 50 ran PART=rounds (bench/results/2026-12-05-h200-s50/
# call2-tdr-rounds/: DFlash / DDTree(63) tree 17.39 / 20.88, b 17.38 / 20.32, d 17.38 / 20.58 ms), made b the default
# and removed d; the copies' sed targets are gone since, so this script is the record of those calls
# (bench/next/k_gram_repeat.sh repeats b against the fp32 product).
#   PART=ops|rounds OUT=... bash bench/next/k_tdr_keys_gram.sh    (writes $OUT/tdr-$PART.tgz; CONFIG=tiny
#   JAX_PLATFORMS=cpu PART=rounds is the dry run: the op bench and the GPU tests need the GPU)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
PART=${PART:?PART=ops or PART=rounds}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
START=$SECONDS
save() { tar czf $OUT/tdr-$PART.tgz -C $W .; }
trap save EXIT
SRC=pallas_kernels/tree_delta_rule/pallas_triton.py
alt() {  # DIR OLD NEW: a copy of the tree with one keyword's default changed
  rm -rf $1 && mkdir $1 && cp -r jaxspec pallas_kernels bench convert pyproject.toml $1/
  sed -i "s/$2/$3/" $1/$SRC
  grep -q "$3" $1/$SRC || { echo "$1: default not set"; exit 2; }
}
rounds() {  # NAME
  timeout 140 python -m bench.rounds --config $CONFIG --context 1024 --phases ddtree,dflash --rounds-only \
    --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$1.json > $W/rounds-$1.log 2>&1
  echo "rounds $1 rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-$1.log | cut -c1-120
}
case $PART in
  ops)
    IMPLS=pallas_triton
    for v in gram_tf32x3 one_kernel; do IMPLS+=,pallas_triton/$v; done
    timeout 170 python -m pallas_kernels.tree_delta_rule.bench --sweep --sizes 16,64,65 --json $W/bench.json \
      --impls $IMPLS > $W/bench.log 2>&1
    echo "bench rc=$? at $((SECONDS - START)) s"; grep "N=" $W/bench.log | cut -c1-120; save
    timeout 330 python -m pytest -q -rA -m gpu tests/test_tree_delta_rule_kernel.py -p no:cacheprovider \
      > $W/gpu-tests.log 2>&1
    echo "tests rc=$? at $((SECONDS - START)) s"; tail -2 $W/gpu-tests.log;;
  rounds)
    alt _alt_gram 'gram_precision="ieee", one_kernel' 'gram_precision="tf32x3", one_kernel'
    alt _alt_one 'one_kernel=False):' 'one_kernel=None):'
    rounds tree; save
    for v in ${VARIANTS-gram one}; do (cd _alt_$v && rounds $v); save; done;;
  *) echo "PART=ops or PART=rounds"; exit 2;;
esac
