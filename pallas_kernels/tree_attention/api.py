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
    committed prefix and its ancestors' slots. Returns [B, N, H, hd] in the values' dtype.
    """
    name = resolve(implementation)
    args = (q, keys, values, start, anc)
    if name != "reference" and pallas_triton.supports(q.shape, keys.shape):
        return pallas_triton.tree_attention(*args, interpret=name == "pallas_interpret")
    return reference.tree_attention(*args)
