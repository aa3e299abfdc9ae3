"""The README's "grouped by kernel" table: the 30 top kernels of verify-tree{64,65}.json by kind.
Run from this directory: python3 by_kernel.py > by_kernel.txt"""
import collections
import json


def kind(k):
    name, op = k["kernel"], k.get("op_name") or ""
    if name.startswith("tree_delta_rule") or "tree_delta_rule" in op or name.startswith("sm80_xmma_gemm_f32"):
        return "tree delta rule (kernels, its f32 gemm, pads)"
    if name.startswith("nvjet") or name.startswith("gemm_fusion"):
        return "gemms (Triton fusions + cuBLAS)"
    return "tree attention" if name == "tree_attention" else "other"


for n in (64, 65):
    d = json.load(open(f"verify-tree{n}.json"))
    by = collections.Counter()
    for k in d["top_kernels"]:
        by[kind(k)] += k["ms_per_step"]
    print(n, "nodes, kernel ms", round(d["kernel_ms_per_step"], 3), {a: round(b, 3) for a, b in sorted(by.items())})
