"""The README's peel table: the 30 top kernels of each verify profile, grouped by kind (as session 22's
bench/results/2026-12-01-h200-s22-loop-graphs-v65/by_kernel.py, plus the peel's slices and concatenations).
Run from this directory: python3 by_kernel.py > by_kernel.txt"""
import collections
import json


def kind(k):
    name, op = k["kernel"], k.get("op_name") or ""
    if name.startswith("tree_delta_rule") or "tree_delta_rule" in op or name.startswith("sm80_xmma_gemm_f32"):
        return "tree delta rule (kernels, its f32 gemm, pads)"
    if name.startswith("nvjet") or name.startswith("gemm_fusion"):
        return "gemms (Triton fusions + cuBLAS)"
    if "concatenate" in name or "slice" in name:
        return "slices and concatenations"
    return "tree attention" if name == "tree_attention" else "other"


for label, path in (("64 nodes", "verify-tree64.json"), ("65 nodes", "verify-tree65.json"),
                    ("65 nodes, root peeled", "verify-tree65-peel.json")):
    d = json.load(open(path))
    by = collections.Counter()
    for k in d["top_kernels"]:
        by[kind(k)] += k["ms_per_step"]
    print(f"{label}: kernel ms {d['kernel_ms_per_step']:.3f}, top 30 {sum(by.values()):.3f}",
          {a: round(b, 3) for a, b in sorted(by.items())})
