#!/bin/bash
# Next GPU session, #6 (nvidia-h200, one call, <= 330 s): the tree delta rule's tuning sweep at N = 64, the size a
# DDTree(63) round verifies. Session 17's table (bench/results/2026-12-01-h200-s17-verify) timed the default
# (ieee dots, dv128/kc32/w4 above 32 nodes) at 27.9 us a GDN layer, 10.1% of copy: 1.34 ms of verify(64)'s
# 20.9 ms, against ~0.8 us to read a layer's fp32 state once. Session 10's sweep at N = 65 was cut before its tf32x3
# rows (bench/results/2026-11-30-h200-s10-xla-flags-tdr-sweep); at N = 16 tf32x3 gave nothing (12.5 vs 11.9 us).
# Prediction: at N = 64 the tf32x3 rows (three tensor-core passes for the N x N x Dk chains) are 15-30% faster than
# ieee at the same tiles, with err <= 1e-5 against the fp32 reference (the fp32 bound is 1e-4). If the best
# is >= 15% faster, make it the default above 32 nodes and re-time the DDTree(63) round (predicted -0.2 to -0.4 ms).
# JAXSPEC_COMMIT=<hash> bash bench/next/k_tdr.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kt; mkdir -p $W
trap '(cd $W && tar czf $OUT/kt.tgz .); grep -h "rc=\|N=" $W/*.log | sort -t"(" -k2 | tail -30' EXIT
timeout 300 python -m pallas_kernels.tree_delta_rule.bench --sizes 64 --sweep --json $W/tdr64.json > $W/tdr64.log 2>&1
echo "tdr sweep rc=$?" >> $W/tdr64.log
