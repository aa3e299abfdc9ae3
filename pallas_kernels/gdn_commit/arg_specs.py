"""Shapes and random inputs shared by the tests and the benchmark: states, and the terms of an accepted path as
tree_delta_rule.path_terms gives them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

# Qwen3.6-27B: 48 GDN layers of 48 value heads over 16 key heads, Dk = Dv = 128; a DDTree(64) path or a DFlash
# block is at most 16 nodes
REAL = dict(layers=48, b=1, h=48, hk=16, dk=128, dv=128, p=16)


def make_inputs(seed, *, layers, b, h, hk, dk, dv, p, keep=None):
    """States [B, H, Dk, Dv] a layer and the terms of an accepted path of p slots (the last few of a sequence off
    its path: w = 0); keep [B] bool (default: every sequence but the last of several)."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    s0s = tuple(jnp.asarray(rng.standard_normal((b, h, dk, dv), f32) * 0.3) for _ in range(layers))
    k = rng.standard_normal((layers, b, p, hk, dk)).astype(f32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    delta = (rng.standard_normal((layers, b, p, h, dv)) * 0.1).astype(f32)
    G = np.cumsum(-rng.uniform(0.0, 0.3, (layers, b, p, h)), axis=2).astype(f32)
    on = np.arange(p)[None] < rng.integers(max(1, p // 2), p + 1, b)[:, None]                 # [B, P]
    last = on.sum(1) - 1
    G_a = G[:, np.arange(b), last]                                                             # [L, B, H]
    w = np.where(on[None, ..., None], np.exp(G_a[:, :, None] - G), 0.0).astype(f32)
    keep = np.arange(b) < max(1, b - 1) if keep is None else np.asarray(keep)
    return s0s, jnp.asarray(w), jnp.asarray(k), jnp.asarray(delta), jnp.asarray(np.exp(G_a)), jnp.asarray(keep)
