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

Peeling the root (`rooted=True`, on when JAXSPEC_TREE_DELTA_RULE_PEEL=1): the kernels work in tiles of 16
nodes, so a DDTree(64) tree of 65 nodes runs as 80 rows, and on the H200 it cost 22.50 ms to verify against
21.03 for 64 nodes, 1.07 ms of it in the tree delta rule (bench/results/2026-12-01-h200-s22-loop-graphs-v65).
When the caller promises that node 0 is an ancestor of every node (the engine's trees: node 0 is the root,
and DDTree's invalid nodes hang from it), the root's step runs alone as a rank-one update and the other
N - 1 nodes as a tree of whole tiles from the state after it: exact, since each node's delta is the true
per-token delta and the state after the root is what every other node starts from. Only where it saves a
tile (the kernels, N = 16 t + 1 > 16); off by default until it is timed on the GPU.

An explicit `implementation=` wins; else the environment variable JAXSPEC_TREE_DELTA_RULE (read when the
caller is traced, so it reaches jaxspec/model.py, which passes no argument); else the default above.
A forced implementation is used as is: forcing "pallas_triton" off the GPU, or beyond 128 nodes, fails.
"""

from __future__ import annotations

import os

import jax.numpy as jnp

from pallas_kernels import dispatch
from pallas_kernels.tree_delta_rule import pallas_triton, reference, xla

ENV_VAR = "JAXSPEC_TREE_DELTA_RULE"
PEEL_ENV_VAR = "JAXSPEC_TREE_DELTA_RULE_PEEL"
IMPLEMENTATIONS = ("pallas_triton", "xla", "reference", "pallas_interpret")


def resolve(n: int, implementation: str | None = None) -> str:
    """The implementation that `tree_delta_rule` runs for a block of n nodes."""
    default = "pallas_triton" if dispatch.on_gpu() and n >= 2 and pallas_triton.supports(n) else "xla"
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, default, implementation, jnp_default="xla")


def peels_root(n: int, name: str, rooted: bool, peel: bool | None = None) -> bool:
    """Whether a block of n nodes run by implementation `name` runs its root alone (see the module doc)."""
    peel = os.environ.get(PEEL_ENV_VAR, "0") == "1" if peel is None else peel
    tile = pallas_triton.TILE
    return rooted and peel and name.startswith("pallas") and n > tile and n % tile == 1


def tree_delta_rule(q, k, v, g, beta, anc, s0, *, implementation: str | None = None, rooted: bool = False,
                    peel: bool | None = None):
    """One block of the gated delta rule on a tree (DESIGN.md section 2).

    q, k: [B, N, H, Dk] (q scaled, both l2-normalised, expanded to value heads); v: [B, N, H, Dv];
    g, beta: [B, N, H] log-decay and write strength; anc: [B, N, N] bool, anc[b, i, j] iff j is an
    ancestor-or-self of i (topological order); s0: [B, H, Dk, Dv] state entering the block.
    rooted: the caller promises that node 0 is an ancestor of every node, which lets the kernels run the
    root alone (`peels_root`; peel=None reads JAXSPEC_TREE_DELTA_RULE_PEEL).
    Returns o [B, N, H, Dv], delta [B, N, H, Dv], G [B, N, H], all fp32.
    """
    n = q.shape[1]
    name = resolve(n, implementation)
    if peels_root(n, name, rooted, peel):
        # the root: the one-node step (as in AR decode), then the state after it
        root = (q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], anc[:, :1, :1])
        o0, delta0, g0 = xla.tree_delta_rule(*root, s0)
        s1 = reference.state_at(s0, k[:, :1], delta0, g0, anc[:, 0, :1], g0[:, 0])
        o, delta, G = tree_delta_rule(q[:, 1:], k[:, 1:], v[:, 1:], g[:, 1:], beta[:, 1:], anc[:, 1:, 1:], s1,
                                      implementation=name)
        return (jnp.concatenate([o0, o], 1), jnp.concatenate([delta0, delta], 1),
                jnp.concatenate([g0, G + g0], 1))
    args = (q, k, v, g, beta, anc, s0)
    if name == "pallas_triton":
        return pallas_triton.tree_delta_rule(*args)
    if name == "pallas_interpret":
        return pallas_triton.tree_delta_rule(*args, interpret=True)
    if name == "xla":
        return xla.tree_delta_rule(*args)
    return reference.tree_delta_rule(*args)
