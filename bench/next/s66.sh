#!/bin/bash
# Session 66's first device call, whatever card comes: the GDN tree inputs op's own GPU tests (owed since 5cd45aa,
# whose reference joins the conv history in bf16), then on an H200 #6's table (bench/next/table.sh, owed since
# session 60: sessions 61-65 got H100s only). On an H100 the call ends after the tests, leaving the budget for a
# later lease.
#   OUT=... bash bench/next/s66.sh        (-> $OUT/gpu.txt, $OUT/gpu-tests-inputs.log, on an H200 $OUT/table.tgz)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "card: $GPU" | tee $OUT/gpu.txt
echo "tree: ${JAXSPEC_COMMIT:-?} dirty=${JAXSPEC_DIRTY:-?}" | tee -a $OUT/gpu.txt
timeout 150 python -m pytest -q -rA -m gpu tests/test_gdn_tree_inputs_kernel.py -p no:cacheprovider \
  > $OUT/gpu-tests-inputs.log 2>&1
echo "inputs tests rc=$?"; tail -3 $OUT/gpu-tests-inputs.log
case "$GPU" in *H200*) exec bash bench/next/table.sh;; esac
