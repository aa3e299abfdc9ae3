"""Pure-jnp reference of tree attention: the spec and the test oracle for its kernels.

Queries are the N nodes of a tree (node i at cache slot start + i); keys/values are a sequence's
cache, which already holds the tree's own K/V at slots start .. start+N-1. Node i sees

    every committed slot p < start                      (the prefix)
    tree slot start + j  iff  anc[i, j]                 (its ancestors-or-self)

and nothing at or past start + N. GQA: query head h reads kv head h // (H / KV). Scores and the
softmax are fp32; the probabilities are cast to the value dtype for the product with V (the math
jaxspec/model.py's Attention always had). The cost is O(L) in the cache length, whatever `start`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def visible(start, anc, length: int):
    """[B, N, L] bool: which cache slots each node sees."""
    n = anc.shape[1]
    rel = jnp.arange(length, dtype=jnp.int32)[None, :] - start[:, None]               # [B, L]
    in_tree = jnp.take_along_axis(anc, jnp.clip(rel, 0, n - 1)[:, None, :].repeat(n, 1), 2)
    return (rel < 0)[:, None, :] | ((rel < n) & (rel >= 0))[:, None, :] & in_tree


def tree_attention(q, keys, values, start, anc):
    """q [B, N, H, hd]; keys, values [B, L, KV, hd] (tree slots written); start [B] int32;
    anc [B, N, N] bool (anc[b, i, j]: node j is an ancestor-or-self of node i).
    Returns [B, N, H, hd] in the values' dtype."""
    b, n, h, hd = q.shape
    kvh = keys.shape[2]
    qh = q.reshape(b, n, kvh, h // kvh, hd)
    scores = jnp.einsum("bnkgh,blkh->bkgnl", qh, keys, preferred_element_type=jnp.float32,
                        precision=jax.lax.Precision.HIGHEST) / math.sqrt(hd)
    scores = jnp.where(visible(start, anc, keys.shape[1])[:, None, None], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, -1).astype(values.dtype)
    out = jnp.einsum("bkgnl,blkh->bnkgh", probs, values, preferred_element_type=jnp.float32,
                     precision=jax.lax.Precision.HIGHEST)
    return out.reshape(b, n, h, hd).astype(values.dtype)
