"""The public tree delta rule: one contract (reference.tree_delta_rule), several implementations.

| implementation     | what                                                        | where by default  |
| ------------------ | ----------------------------------------------------------- | ----------------- |
| "pallas_triton"    | the Pallas kernels, Triton lowering (pallas_triton.py)      | GPU, 2..128 nodes |
| "xla"              | jnp, triangular inverse by recursive doubling (xla.py)      | everywhere else   |
| "reference"        | jnp with solve_triangular: the spec (reference.py)          | never             |
| "pallas_interpret" | the Pallas kernels' bodies run by the CPU interpreter        | never (tests)     |

"xla" is the default off the GPU: against a float64 recurrence it is at least as accurate as the
reference (error 0.99x the reference's, geometric mean over 125 random and correlated-key cases,
N = 16..65; xla.py, tests/test_tree_delta_rule_kernel.py), and it never emits a trsm. The kernels
were more accurate still (0.6-0.7x) but run only interpreted off the GPU.

On the GPU the kernels are the default for blocks of 2..128 nodes (DFlash blocks, DDTree trees, prefill
chunks of 64): all 26 GPU tests passed on the H200 (the last, chunked prefill, on 2026-11-30), and at
the real 27B shape (1K context, 64 layers) they made the DFlash round 20.81 -> 18.86 ms and the DDTree(64)
round 30.86 -> 29.85 ms (bench/results/2026-11-30-h200-tree-delta-rule-default/). The one-node decode
step keeps the xla solver (for N = 1 it is a rank-one update; the kernel was not timed there), as do
trees beyond the kernel's 128 nodes.

An explicit `implementation=` wins; else the environment variable JAXSPEC_TREE_DELTA_RULE (read when the
caller is traced, so it reaches jaxspec/model.py, which passes no argument); else the default above.
A forced implementation is used as is: forcing "pallas_triton" off the GPU fails, and forcing either kernel on a
block beyond 128 nodes is refused, naming the argument or variable that forced it.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels import dispatch
from pallas_kernels.tree_delta_rule import pallas_triton, reference, xla

ENV_VAR = "JAXSPEC_TREE_DELTA_RULE"
IMPLEMENTATIONS = ("pallas_triton", "xla", "reference", "pallas_interpret")


def resolve(n: int, implementation: str | None = None) -> str:
    """The implementation that `tree_delta_rule` runs for a block of n nodes."""
    default = "pallas_triton" if dispatch.on_gpu() and n >= 2 and pallas_triton.supports(n) else "xla"
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, default, implementation, jnp_default="xla")


def tree_delta_rule(q, k, v, g, beta, anc, s0, *, implementation: str | None = None):
    """One block of the gated delta rule on a tree (DESIGN.md section 2).

    q, k: [B, N, Hk, Dk] (q scaled, both l2-normalised), key head h // (H / Hk) serving value head h;
    v: [B, N, H, Dv];
    g, beta: [B, N, H] log-decay and write strength; anc: [B, N, N] bool, anc[b, i, j] iff j is an
    ancestor-or-self of i (topological order); s0: [B, H, Dk, Dv] state entering the block.
    Returns o [B, N, H, Dv], delta [B, N, H, Dv], G [B, N, H], all fp32.
    Arguments of other shapes are refused (reference.check_args); an empty block (B or N 0) gives the reference's
    empty outputs, whatever the implementation.
    """
    args = (q, k, v, g, beta, anc, s0)
    reference.check_args(*args)
    name = resolve(q.shape[1], implementation)
    b, n, h, dv = v.shape
    if not b * n:           # the kernels' grids and index maps need a sequence and a node (the kernel refuses N = 0)
        f32 = jnp.float32
        return jnp.zeros((b, n, h, dv), f32), jnp.zeros((b, n, h, dv), f32), jnp.zeros((b, n, h), f32)
    if name.startswith("pallas") and not pallas_triton.supports(n):
        raise ValueError(f"{dispatch.chosen_by(ENV_VAR, implementation)}: the tree delta rule kernels take 1.."
                         f"{pallas_triton.MAX_N} nodes, and this block has {n}; use xla")
    if name == "pallas_triton":
        return pallas_triton.tree_delta_rule(*args)
    if name == "pallas_interpret":
        return pallas_triton.tree_delta_rule(*args, interpret=True)
    if name == "xla":
        return xla.tree_delta_rule(*args)
    return reference.tree_delta_rule(*args)
