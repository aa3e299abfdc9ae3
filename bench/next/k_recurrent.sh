#!/bin/bash
# #6, the DFlash verify's tree delta rule as the recurrence (pallas_kernels/tree_delta_rule/recurrent.py, opt-in
# JAXSPEC_TREE_DELTA_RULE=pallas_recurrent; written in session 66 without a GPU). One call, either card, ~6 min:
#   1. its GPU tests (and the WY kernels' chain cases beside it);
#   2. the op at the real heads on chains of 16 and 32 nodes, 48 stacked layers: the WY kernels against the
#      recurrence (pallas_kernels.tree_delta_rule.bench --shape chain);
#   3. the DFlash round at 1K with the opt-in and without (bench/next/k_rounds_ab.sh, ~2 min a setting).
#   OUT=... bash bench/next/k_recurrent.sh     (-> $OUT/gpu.txt, gpu-tests-recurrent.log, op.json/.log, rounds-ab.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee $OUT/gpu.txt
timeout 150 python -m pytest -q -rA -m gpu tests/test_tree_delta_rule_recurrent.py -p no:cacheprovider \
  > $OUT/gpu-tests-recurrent.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/gpu-tests-recurrent.log
timeout 120 python -m pallas_kernels.tree_delta_rule.bench --shape chain --sizes 16,32 \
  --impls pallas_triton,pallas_recurrent --json $OUT/op.json > $OUT/op.log 2>&1
echo "op rc=$?"; grep "^N=" $OUT/op.log
PHASES=dflash bash bench/next/k_rounds_ab.sh "JAXSPEC_TREE_DELTA_RULE=pallas_recurrent" ""
