"""The jaxprs of the tree delta rule kernels (pallas_call bodies included) over 64 cases, written to argv[1]:
compared before and after a change that must not alter them.  PYTHONPATH=. python jaxprs.py out.txt"""
import sys, jax, jax.numpy as jnp
from pallas_kernels.tree_delta_rule import pallas_triton
f32 = jnp.float32
out = []
for n in (1, 16, 40, 65):
    for opts in ({}, {"gram_inside": True}, {"gram_inside": False}, {"precision": "tf32x3", "gram_precision": "ieee"}):
        for interpret in (False, True):
            b, h, hk, dk, dv = 1, 4, 2, 32, 32
            S = jax.ShapeDtypeStruct
            shapes = (S((b, n, hk, dk), f32), S((b, n, hk, dk), f32), S((b, n, h, dv), f32), S((b, n, h), f32),
                      S((b, n, h), f32), S((b, n, n), jnp.bool_), S((b, h, dk, dv), f32))
            j = jax.make_jaxpr(lambda *a: pallas_triton.tree_delta_rule(*a, interpret=interpret, **opts))(*shapes)
            out.append(f"== n={n} {opts} interpret={interpret}\n{j}")
txt = "\n".join(out)
open(sys.argv[1], "w").write(txt)
print(len(txt))
