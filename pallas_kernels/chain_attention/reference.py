"""Pure-jnp chain attention: the spec, and the jnp forms of the split the GPU path makes.

A chain block is N nodes at cache slots start .. start+N-1, node i the parent of node i+1 (a prefill piece). Node i
sees every committed slot p < start and the block's nodes 0 .. i: tree attention (pallas_kernels/tree_attention)
with a lower-triangular ancestor mask, which is the spec here. The GPU path splits the keys in two:

    the prefix, slots 0 .. start-1, seen whole by every node: online-softmax partials (m, l, acc) per prefix split
    (pallas_kernels/tree_attention/pallas_triton.py `prefix_partials`);
    the block's own keys, causal: a flash-attention kernel's output o and the log-sum-exp of its scores, lse
    (cudnn.py; `self_attention` below is its jnp form)

and merges them (`merge`): with mx the largest of the m's and lse, out = (sum_s e^(m_s - mx) acc_s + e^(lse - mx) o) /
(sum_s e^(m_s - mx) l_s + e^(lse - mx)). Every node sees itself, so lse is finite and so is mx.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from pallas_kernels.tree_attention import reference as tree_reference


def causal_mask(b: int, n: int):
    """[B, N, N] bool: node j is an ancestor-or-self of node i in a chain iff j <= i."""
    return jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (b, n, n))


def chain_attention(q, k, v, keys, values, start):
    """q [B, N, H, hd]; k, v [B, N, KV, hd] the block's own keys and values, already written to keys, values
    [B, L, KV, hd] at slots start .. start+N-1; start [B] int32. Returns [B, N, H, hd] in the values' dtype."""
    del k, v                        # the spec reads the block's keys from the cache, where the caller wrote them
    return tree_reference.tree_attention(q, keys, values, start, causal_mask(q.shape[0], q.shape[1]))


def self_attention(q, k, v):
    """The block's nodes over the block alone, causal: (o [B, N, H, hd] normalised, lse [B, N, H] fp32 the log-sum-exp
    of each row's scaled scores). Scores and softmax in fp32, probabilities cast to the values' dtype for the product
    with V, as the tree reference does."""
    b, n, h, hd = q.shape
    kvh = k.shape[2]
    qh = q.reshape(b, n, kvh, h // kvh, hd)
    s = jnp.einsum("bnkgh,bmkh->bkgnm", qh, k, preferred_element_type=jnp.float32,
                   precision=jax.lax.Precision.HIGHEST) / math.sqrt(hd)
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1)                                                   # [B, KV, G, N]
    p = jnp.exp(s - lse[..., None]).astype(v.dtype)
    o = jnp.einsum("bkgnm,bmkh->bnkgh", p, v, preferred_element_type=jnp.float32, precision=jax.lax.Precision.HIGHEST)
    return o.reshape(b, n, h, hd), jnp.moveaxis(lse, -1, 1).reshape(b, n, h)


def merge(m, l, acc, o, lse):
    """The prefix's partials (m, l [B, N, H, S], acc [B, N, H, S, hd]) and the block's (o [B, N, H, hd], lse
    [B, N, H]) as one attention output [B, N, H, hd], fp32."""
    f32 = jnp.float32
    lse = lse.astype(f32)
    mx = jnp.maximum(jnp.max(m, axis=-1), lse)
    w = jnp.exp(m - mx[..., None])                     # a split with nothing seen: m = -inf, w = 0
    ws = jnp.exp(lse - mx)
    num = jnp.sum(w[..., None] * acc, axis=-2) + ws[..., None] * o.astype(f32)
    return num / (jnp.sum(w * l, axis=-1) + ws)[..., None]
