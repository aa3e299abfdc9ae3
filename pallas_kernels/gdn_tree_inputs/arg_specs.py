"""Shapes and inputs shared by the tests and the benchmark of the GDN tree inputs kernel."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

REAL = dict(hk=16, rep=3, dk=128, dv=128, kw=4)   # Qwen3.6-27B's GDN layers: 16 key heads, 48 value heads
REAL_GDN_LAYERS = 48


def make_inputs(seed, parent, hk, rep, dk, dv, kw, dtype=jnp.float32):
    """(y, history, conv_w, A_log, dt_bias, rows) for trees given by parent [B, N] (-1 at the root), fresh
    random values (never zeros): in_proj outputs and history ~N(0, 1), conv taps ~N(0, 0.25), A_log ~U(0, 2.8),
    dt_bias ~N(0, 1)."""
    rng = np.random.default_rng(seed)
    parent = np.asarray(parent)
    b, n = parent.shape
    hv, c = hk * rep, hk * (2 * dk + rep * dv)
    w = c + hv * dv + 2 * hv
    y = rng.standard_normal((b, n, w))
    history = rng.standard_normal((b, kw - 1, c))
    conv_w = 0.5 * rng.standard_normal((kw, c))
    a_log = rng.uniform(0.0, 2.8, hv)
    dt_bias = rng.standard_normal(hv)
    cast = lambda x: jnp.asarray(x, jnp.float32).astype(dtype)
    return (cast(y), cast(history), cast(conv_w), jnp.asarray(a_log, jnp.float32),
            jnp.asarray(dt_bias, jnp.float32), jnp.asarray(window_rows(parent, kw)))


def window_rows(parent, kw):
    """[B, K, N] int32 by walking the parents in numpy (independent of jaxspec's tree code): row d is each
    node's input d steps up as an index into concat(history [K-1], nodes); past the root, history row
    K-1 + depth - d."""
    b, n = parent.shape
    rows = np.zeros((b, kw, n), np.int32)
    for bi in range(b):
        for i in range(n):
            node, depth = i, 0
            while parent[bi, node] >= 0:
                node, depth = parent[bi, node], depth + 1
            for d in range(kw):
                up = i
                for _ in range(d):
                    up = parent[bi, up] if up >= 0 else -1
                rows[bi, d, i] = kw - 1 + up if up >= 0 else kw - 1 + depth - d
    return rows


def random_parents(seed, b, n, chain=False):
    rng = np.random.default_rng(seed)
    if chain:
        return np.broadcast_to(np.arange(n) - 1, (b, n)).copy()
    return np.stack([np.array([-1] + [rng.integers(0, i) for i in range(1, n)]) for _ in range(b)])
