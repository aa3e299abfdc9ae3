#!/bin/bash
# Next GPU session, #6 (nvidia-h200, one call, ~4 min): verify of a 65-node tree with the tree delta rule's root
# run alone (JAXSPEC_TREE_DELTA_RULE_PEEL=1, pallas_kernels/tree_delta_rule/api.py), against the default and a
# 64-node tree, all profiled by kernel in one lease, then the kernel's GPU tests (the peeled case included).
# Session 22 (bench/results/2026-12-01-h200-s22-loop-graphs-v65): verify 21.03 ms (64 nodes) against 22.50 (65),
# of which the tree delta rule +1.07 ms (65 nodes run as 80 rows: prepare +0.39, apply +0.09, its f32 Gram gemm
# +0.21, the pads +0.28).
# Predicted: peeled verify(65) 21.8-22.1 ms of kernel time (a saving of 0.4-0.7 ms: the tiles' share back, less
# the root step and the slices / concatenations, ~3 small kernels a layer); the tree delta rule's kernels at their
# 64-node times (prepare ~1.20, apply ~1.04 ms). If it saves >= 0.4 ms, make the peel the default.
# JAXSPEC_COMMIT=<hash> bash bench/next/k_peel.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kp; mkdir -p $W/n64 $W/n65 $W/n65peel
trap '(cd $W && tar czf $OUT/kp.tgz .); grep -h "rc=\|passed\|failed" $W/*.log' EXIT
run() {  # name nodes [env]
  env $3 timeout 150 python -m bench.verify_profile --config real --nodes $2 --tree --out $W/$1 > $W/$1.log 2>&1
  echo "verify_profile $1 rc=$?" >> $W/$1.log
}
run n65 65; run n65peel 65 JAXSPEC_TREE_DELTA_RULE_PEEL=1; run n64 64
python - <<'PY' > $W/compare.txt 2>&1
import json
for name in ("n64", "n65", "n65peel"):
    d = json.load(open(f"/tmp/kp/{name}/verify-tree{64 if name == 'n64' else 65}.json"))
    tdr = sum(k["ms_per_step"] for k in d["top_kernels"] if "tree_delta_rule" in k["kernel"] + (k.get("op_name") or ""))
    print(f"{name:8s} kernel {d['kernel_ms_per_step']:.3f} ms  gemms {d['gemm_ms_per_step']:.3f}  tree delta rule (top kernels) {tdr:.3f}")
PY
cat $W/compare.txt
timeout 150 python -m pytest -q -m gpu tests/test_tree_delta_rule_kernel.py -k "peel or gpu_kernel_matches" > $W/tests.log 2>&1
echo "tests rc=$?" >> $W/tests.log
