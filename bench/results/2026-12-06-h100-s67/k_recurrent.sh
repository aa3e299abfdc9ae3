#!/bin/bash
# #6, the DFlash verify's tree delta rule as the recurrence (pallas_kernels/tree_delta_rule/recurrent.py, opt-in
# JAXSPEC_TREE_DELTA_RULE=pallas_recurrent; written in session 66 without a GPU). Two calls, either card:
#   PART=ops (~4 min): its GPU tests (4 cases: N 16 / 32 / 23 padded, batch 2, three tilings), then the op at the
#     real heads on chains of 16 and 32 nodes, 48 stacked layers: the WY kernels (pallas_triton) against the
#     recurrence and its tilings (pallas_kernels.tree_delta_rule.bench --shape chain --sweep; block_dv 16 / 32 / 64
#     x 1 / 2 / 4 warps).
#   PART=rounds (~5 min): the DFlash round at 1K with the opt-in, without, and with it again (bench/next/k_rounds_ab.sh,
#     ~90 s a setting, at most 170: three fit the 600 s a call may take; one lease's identical code has spread
#     0.2-0.4 ms a round).
#   PART=ops OUT=... bash bench/next/k_recurrent.sh   (-> $OUT/gpu.txt, gpu-tests-recurrent.log, op.json, op.log)
#   PART=rounds OUT=... bash bench/next/k_recurrent.sh   (-> $OUT/gpu.txt, rounds-ab.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee $OUT/gpu.txt
case "${PART:?set PART=ops or PART=rounds}" in
  ops)
    timeout 150 python -m pytest -q -rA -m gpu tests/test_tree_delta_rule_recurrent.py -p no:cacheprovider \
      > $OUT/gpu-tests-recurrent.log 2>&1
    echo "tests rc=$?"; tail -2 $OUT/gpu-tests-recurrent.log
    IMPLS=pallas_triton,pallas_recurrent$(for d in 16 32 64; do for w in 1 2 4; do printf ",pallas_recurrent/dv$d/w$w";
      done; done)
    timeout 300 python -m pallas_kernels.tree_delta_rule.bench --shape chain --sizes 16,32 --sweep --impls $IMPLS \
      --json $OUT/op.json > $OUT/op.log 2>&1
    echo "op rc=$?"; grep "^N=" $OUT/op.log;;
  rounds)
    PHASES=dflash bash bench/next/k_rounds_ab.sh "JAXSPEC_TREE_DELTA_RULE=pallas_recurrent" "" \
      "JAXSPEC_TREE_DELTA_RULE=pallas_recurrent";;
  *) echo "PART=ops or PART=rounds"; exit 2;;
esac
