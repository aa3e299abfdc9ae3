#!/bin/bash
# #6 (nvidia-h200, two calls): the tree delta rule with grouped key heads and, for one tile, its Gram tiles inside
# the prepare kernel (session 42).
# Session 42's verify profile (bench/results/2026-12-04-h200-s42/parts/): verify(16) spent 1.94 ms of its 16.24 ms
# kernels in the GDN's non-product kernels, ~22 kernels a layer: the Gram products K K^T / Q K^T (0.28 ms), G = anc g
# (0.07), q and k repeated to the value heads (0.19), g / beta transposes, prepare (0.22) and apply (0.33).
# Now q and k stay at the 16 key heads (the kernels' index maps read key head h // 3), G and, for a block of one
# tile, the Gram tiles are computed inside prepare, and g / beta / G are read as strided columns.
# Predicted: verify(16) kernels 0.4-0.7 ms shorter, verify(64) 0.3-0.5 ms shorter; the DFlash round by about
# verify(16)'s gain, the DDTree(63) round by about verify(64)'s.
# The baseline is ae2539e's code, carried as _base/ (git archive of jaxspec, pallas_kernels, bench; not committed),
# run from inside _base/ (`python -m` puts the working directory first on sys.path: in session 42's kernel call the
# base runs, then started from the root with PYTHONPATH=_base, imported the new code).
#   OUT=... bash bench/next/k_tdr_grouped.sh kernel   (~5 min) the kernel's GPU tests, its bench, verify by part
#   OUT=... bash bench/next/k_tdr_grouped.sh rounds   (~8 min) the rounds, old and new, then the engine's GPU tests
# Writes $OUT/tdr-PART.tgz. CONFIG=tiny JAX_PLATFORMS=cpu for a dry run.
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
W=$(mktemp -d)
PART=$1
START=$SECONDS
case "$PART" in
  kernel)
    PYTHONPATH=. timeout 220 python -m pytest -q -rA -m gpu tests/test_tree_delta_rule_kernel.py -p no:cacheprovider \
      > $W/gpu-tests-tdr.log 2>&1
    echo "tests rc=$? at $((SECONDS - START)) s"; tail -2 $W/gpu-tests-tdr.log
    for side in _base .; do
      tag=$([ $side = . ] && echo new || echo base)
      (cd $side && PYTHONPATH=. timeout 90 python -m pallas_kernels.tree_delta_rule.bench --sizes 16,64,65 \
        --impls pallas_triton --json $W/tdr-bench-$tag.json > $W/tdr-bench-$tag.log 2>&1)
      echo "bench $tag rc=$? at $((SECONDS - START)) s"; grep "N=" $W/tdr-bench-$tag.log | cut -c1-150
      for spec in "16 chain" "64 tree"; do
        set -- $spec
        (cd $side && PYTHONPATH=. timeout 80 python -m bench.verify_profile --config $CONFIG --nodes $1 \
          $([ $2 = tree ] && echo --tree) --out $W/verify-$tag > $W/verify$1-$tag.log 2>&1)
        echo "verify($1) $tag rc=$? at $((SECONDS - START)) s"
        grep -m3 "kernel_ms_per_step\|gemm_ms_per_step\|other_kernels" $W/verify$1-$tag.log
      done
    done;;
  rounds)
    for side in _base .; do
      tag=$([ $side = . ] && echo new || echo base)
      (cd $side && PYTHONPATH=. timeout 150 python -m bench.rounds --config $CONFIG --context 1024 \
        --phases dflash,ddtree --rounds-only --budgets 63 --round-budget 63 --max-len 8192 --out $W/rounds-$tag.json \
        > $W/rounds-$tag.log 2>&1)
      echo "rounds $tag rc=$? at $((SECONDS - START)) s"; grep "_round " $W/rounds-$tag.log | cut -c1-200
    done
    PYTHONPATH=. timeout $((570 - (SECONDS - START))) python -m pytest -q -rA -m gpu tests/test_kernels_engine.py \
      tests/test_engine.py -p no:cacheprovider > $W/gpu-tests-engine.log 2>&1
    echo "engine tests rc=$? at $((SECONDS - START)) s"; tail -4 $W/gpu-tests-engine.log;;
  *) echo "usage: bash bench/next/k_tdr_grouped.sh kernel | rounds"; exit 2;;
esac
tar czf $OUT/tdr-$PART.tgz -C $W .
