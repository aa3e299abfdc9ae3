"""The public tree attention: one contract (reference.tree_attention), several implementations.

| implementation     | what                                                         | where by default |
| ------------------ | ------------------------------------------------------------ | ---------------- |
| "pallas_triton"    | the flash-decoding Pallas kernel, Triton lowering            | on GPU           |
| "reference"        | jnp over the whole cache (reference.py): the spec            | elsewhere        |
| "pallas_interpret" | the kernel's body run by the CPU interpreter                 | never (tests)    |

An explicit `implementation=` wins; else the environment variable JAXSPEC_TREE_ATTENTION (read when the
caller is traced, so it reaches jaxspec/model.py, which passes no argument); else the kernel on GPU
(its 16 GPU tests passed on the H200: bench/results/2026-11-29-h200x2-kernel-gpu-tests.log) and the
reference elsewhere. Under a tensor-parallel mesh it runs per shard (jaxspec/sharding.py). Shapes the kernel does not take
(head_dim not a power of two >= 16, a cache shorter than 16 slots) run the reference.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels import dispatch
from pallas_kernels.tree_attention import pallas_triton, reference

ENV_VAR = "JAXSPEC_TREE_ATTENTION"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(implementation: str | None = None) -> str:
    """The implementation that `tree_attention` runs."""
    default = "pallas_triton" if dispatch.on_gpu() else "reference"
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, default, implementation)


def tree_attention(q, keys, values, start, anc, *, implementation: str | None = None):
    """Attention of the N nodes of a tree over a sequence's cache (DESIGN.md section 2).

    q: [B, N, H, hd] queries (RoPE applied); keys, values: [B, L, KV, hd], the cache with the tree's own
    K/V already written at slots start .. start+N-1; start: [B] int32 committed length per sequence;
    anc: [B, N, N] bool, anc[b, i, j] iff node j is an ancestor-or-self of node i. Node i sees the
    committed prefix and its ancestors' slots. Returns [B, N, H, hd] in the values' dtype. Shapes that
    break this contract are refused (`check_shapes`); an empty q (B, N, H or hd 0) gives an empty result.
    """
    name = resolve(implementation)
    check_shapes(q, keys, values, start, anc)
    if q.size == 0:         # nothing to attend (the kernel's grid would be empty); the reference's result
        return jnp.zeros(q.shape, values.dtype)
    args = (q, keys, values, start, anc)
    if name != "reference" and pallas_triton.supports(q.shape, keys.shape):
        return pallas_triton.tree_attention(*args, interpret=name == "pallas_interpret")
    return reference.tree_attention(*args)


def check_shapes(q, keys, values, start, anc):
    """ValueError naming the argument unless q [B, N, H, hd]; keys, values [B, L, KV, hd] with KV dividing H;
    start [B] integer; anc [B, N, N] bool or integer (static shapes: a Python check, also under jit)."""
    if q.ndim != 4:
        raise ValueError(f"tree_attention: q {q.shape} must be [B, N, H, hd]")
    b, n, h, hd = q.shape
    if keys.ndim != 4 or keys.shape[0] != b or keys.shape[3] != hd:
        raise ValueError(f"tree_attention: keys {keys.shape} must be [B, L, KV, hd] = [{b}, L, KV, {hd}] "
                         f"for q {q.shape}")
    if values.shape != keys.shape:
        raise ValueError(f"tree_attention: values {values.shape} must have the shape of keys {keys.shape}")
    kvh = keys.shape[2]
    if kvh == 0 or h % kvh:
        raise ValueError(f"tree_attention: the {h} query heads of q {q.shape} must be a multiple of the {kvh} "
                         f"kv heads of keys {keys.shape}")
    if start.shape != (b,) or not jnp.issubdtype(start.dtype, jnp.integer):
        raise ValueError(f"tree_attention: start {start.shape} {start.dtype} must be [B] = ({b},) integer")
    if anc.shape != (b, n, n):
        raise ValueError(f"tree_attention: anc {anc.shape} must be [B, N, N] = {(b, n, n)} for q {q.shape}")
    if not (anc.dtype == jnp.bool_ or jnp.issubdtype(anc.dtype, jnp.integer)):
        raise ValueError(f"tree_attention: anc {anc.shape} {anc.dtype} must be bool (or integer 0 / 1): the kernel "
                         f"thresholds it, the reference masks with it")
