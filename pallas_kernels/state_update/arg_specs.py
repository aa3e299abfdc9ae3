"""Shapes and inputs shared by the tests and the benchmark of the commit's GDN state update."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

REAL = dict(hk=16, rep=3, dk=128, dv=128)   # Qwen3.6-27B's GDN layers: 16 key heads, 48 value heads
REAL_GDN_LAYERS = 48


def random_parents(b: int, n: int, rng, chain: bool = False) -> np.ndarray:
    """parent [B, N] (-1 at the root): a chain, or each node's parent drawn among the nodes before it."""
    if chain:
        return np.broadcast_to(np.arange(-1, n - 1), (b, n)).copy()
    return np.stack([np.array([-1] + [rng.integers(0, i) for i in range(1, n)]) for _ in range(b)])


def make_inputs(seed, b, n, hk, rep, dk, dv, chain=False, keep=None):
    """(s0, k, delta, G, anc_row, last, keep) with fresh random values (never zeros): S0 ~N(0, 1); k l2-normalised
    per key head, as the model's; Delta ~N(0, 1); G the log-decays g ~ -U(0.01, 1) cumulated root to leaf along
    the tree; `last` a random node per row and anc_row its ancestors-or-self; keep all True unless given."""
    rng = np.random.default_rng(seed)
    h = hk * rep
    parent = random_parents(b, n, rng, chain)
    g = -rng.uniform(0.01, 1.0, (b, n, h))
    G = np.zeros((b, n, h))
    for i in range(n):
        G[:, i] = g[:, i] + np.where((parent[:, i] >= 0)[:, None], G[np.arange(b), np.maximum(parent[:, i], 0)], 0)
    last = rng.integers(0, n, b)
    anc = np.zeros((b, n), bool)
    for r in range(b):
        j = last[r]
        while j >= 0:
            anc[r, j], j = True, parent[r, j]
    k = rng.standard_normal((b, n, hk, dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    keep = np.ones(b, bool) if keep is None else np.asarray(keep)
    f = lambda x: jnp.asarray(x, jnp.float32)
    return (f(rng.standard_normal((b, h, dk, dv))), f(k), f(rng.standard_normal((b, n, h, dv))), f(G),
            jnp.asarray(anc), jnp.asarray(last, jnp.int32), jnp.asarray(keep))
