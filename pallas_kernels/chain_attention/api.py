"""The public chain attention: one contract (reference.chain_attention), several implementations.

| implementation     | what                                                                  | where by default  |
| ------------------ | --------------------------------------------------------------------- | ----------------- |
| "pallas_cudnn"     | the prefix by the tree attention kernel's prefix programs, the block  | GPU: chains of    |
|                    | by cuDNN's causal flash attention, merged (reference.py)              | >= 128 nodes over |
|                    |                                                                       | a 16-bit cache    |
| "tree"             | tree attention with a causal mask (whatever                           | everywhere else   |
|                    | pallas_kernels/tree_attention runs: its kernel on a GPU)              |                   |
| "reference"        | the spec (tree attention's jnp reference with a causal mask)          | never             |
| "pallas_interpret" | the split of "pallas_cudnn" with the prefix kernel interpreted and    | never (tests)     |
|                    | the block's attention in jnp                                          |                   |

A prefill piece is a chain. Through the tree kernel every 64-row block of an 8K chain tiles its keys 32 at a time and
reads an ancestor mask: 100.9 of an 8K prefill's 934 ms of kernels on an H100 (16 layers, ~131 TFLOP/s), where cuDNN's
kernel does the causal half at ~530. With this op the 8K prefill went from 958.81 to 886.69 ms on an H100 in one lease,
and took 864.17 on an H200 (bench/results/2026-12-06-{h100,h200}-s63/). Short chains (a DFlash block of 16) stay with
the tree kernel: one launch, not a prefix kernel, a cuDNN call and a merge.

An explicit `implementation=` wins; else JAXSPEC_CHAIN_ATTENTION; else the default above. "pallas_cudnn" forced where
cuDNN cannot run (no GPU, an fp32 cache) fails.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels import dispatch
from pallas_kernels.chain_attention import cudnn, reference
from pallas_kernels.tree_attention import api as tree_api
from pallas_kernels.tree_attention import pallas_triton

ENV_VAR = "JAXSPEC_CHAIN_ATTENTION"
IMPLEMENTATIONS = ("pallas_cudnn", "tree", "reference", "pallas_interpret")
MIN_NODES = 128     # shorter chains go through the tree kernel


def resolve(q, keys, implementation: str | None = None) -> str:
    """The implementation that `chain_attention` runs for nodes q [B, N, H, hd] over the cache keys [B, L, KV, hd]."""
    fits = (dispatch.on_gpu() and q.shape[1] >= MIN_NODES and cudnn.supports(q, keys) and cudnn.available()
            and pallas_triton.supports(q.shape, keys.shape))
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "pallas_cudnn" if fits else "tree", implementation,
                            jnp_default="tree")


def chain_attention(q, k, v, keys, values, start, *, implementation: str | None = None):
    """Attention of a chain block (reference.chain_attention's contract): q [B, N, H, hd]; k, v [B, N, KV, hd] the
    block's own keys and values, already written to the cache keys, values [B, L, KV, hd] at slots start ..
    start+N-1; start [B] int32. Node i sees the committed prefix and the block's nodes 0 .. i. Returns [B, N, H, hd]
    in the values' dtype."""
    tree_api.check_shapes(q, keys, values, start, jax.ShapeDtypeStruct(q.shape[:2] + q.shape[1:2], jnp.bool_))
    if k.shape != q.shape[:2] + keys.shape[2:] or v.shape != k.shape:
        raise ValueError(f"chain_attention: k {k.shape} and v {v.shape} must be the block's [B, N, KV, hd] = "
                         f"{q.shape[:2] + keys.shape[2:]}")
    name = resolve(q, keys, implementation)
    if name == "reference":
        return reference.chain_attention(q, k, v, keys, values, start)
    if name == "tree" or q.size == 0:
        return tree_api.tree_attention(q, keys, values, start, reference.causal_mask(q.shape[0], q.shape[1]))
    if not pallas_triton.supports(q.shape, keys.shape):     # its prefix kernel's shapes
        raise ValueError(f"{dispatch.chosen_by(ENV_VAR, implementation)}: the chain attention kernels take head_dim "
                         f"16..{pallas_triton.MAX_HEAD_DIM}, a power of two, and a cache of >= 16 slots; got q "
                         f"{q.shape} over keys {keys.shape}; use tree")
    interpret = name == "pallas_interpret"
    dt = values.dtype
    o, lse = (reference if interpret else cudnn).self_attention(q.astype(dt), k.astype(dt), v.astype(dt))

    def with_prefix(_):
        m, l, acc = pallas_triton.prefix_partials(q, keys, values, start, interpret=interpret)
        return reference.merge(m, l, acc, o, lse).astype(dt)

    # A first piece (every row's start 0) has no prefix to read: the block's attention is the answer.
    return jax.lax.cond(jnp.any(start > 0), with_prefix, lambda _: o.astype(dt), None)
