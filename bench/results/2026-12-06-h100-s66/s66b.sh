#!/bin/bash
# Session 66's second device call, whatever card comes: the chain delta rule's state pass now writes Delta, and O is
# E Q S_in + P Delta (no M = P Tb, no U = E Q - M E K, no M V). Its GPU tests and the GDN inputs op's (owed since
# 5cd45aa), then the 8K one-piece prefill before (3a867c9, carried as `_alt/`, made with `git archive 3a867c9
# jaxspec pallas_kernels bench ':!bench/results' ':!jaxspec/demo'`) and after, twice each, alternating.
# NEW_TREE=DIR times the "after" tree from DIR (an archive of a commit, carried) instead of the working tree.
#   OUT=... bash bench/next/s66b.sh [tests|ab]   (no argument: both; -> $OUT/gpu.txt, $OUT/gpu-tests-*.log,
#                                                 $OUT/ab-*.{json,log})
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "card: $GPU" | tee $OUT/gpu.txt
echo "tree: ${JAXSPEC_COMMIT:-?} dirty=${JAXSPEC_DIRTY:-?}" | tee -a $OUT/gpu.txt
if [ "$1" != ab ]; then
  timeout 200 python -m pytest -q -rA -m gpu tests/test_chain_delta_rule.py tests/test_gdn_tree_inputs_kernel.py \
    -p no:cacheprovider > $OUT/gpu-tests-chain-inputs.log 2>&1
  echo "tests rc=$?"; tail -3 $OUT/gpu-tests-chain-inputs.log
fi
if [ "$1" != tests ]; then
  for run in old-1 new-1 old-2 new-2; do
    tree=$([ ${run%-*} = old ] && echo _alt || echo ${NEW_TREE:-.})
    # new-1 also times Engine.prefill in pieces of 256 (the default until 4bb227c) and 1024 (the default since)
    chunks=$([ $run = new-1 ] && echo "--prefill-chunks 256,1024")
    (cd $tree && PYTHONPATH=. timeout $([ $run = new-1 ] && echo 200 || echo 110) python -m bench.harness \
      --config real --contexts '' --prompt 8192 --prefill-iters 5 --ceiling-iters 3 $chunks --out $OUT/ab-$run.json \
      > $OUT/ab-$run.log 2>&1)
    echo "$run rc=$?"; grep -E "^\[ *[0-9.]+s\] (engine )?prefill P=8192.*ms" $OUT/ab-$run.log | cut -c1-150
  done
fi
