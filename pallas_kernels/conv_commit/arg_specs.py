"""Shapes and random inputs shared by the tests and the benchmark: conv histories, a block's pre-conv inputs and an
accepted node's window rows."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

# Qwen3.6-27B: 48 GDN layers, a conv of kernel 4 (3 rows of history) over 10240 channels (q, k: 16 heads x 128;
# v: 48 heads x 128), bf16; a DFlash block or a DDTree path is at most 16 nodes (a DDTree(63) tree: 64)
REAL = dict(layers=48, b=1, km1=3, n=16, c=10240)


def make_inputs(seed, *, layers, b, km1, n, c, dtype=jnp.bfloat16, keep=None):
    """Histories [B, K-1, C] and conv_ins [B, N, C] a layer; win [B, K-1]: a window ending at a random node of
    depth d (rows of the history while d < K-1, then nodes); keep [B] (default: every sequence but the last of
    several)."""
    rng = np.random.default_rng(seed)
    hists = tuple(jnp.asarray(rng.standard_normal((b, km1, c)), dtype) for _ in range(layers))
    conv_ins = tuple(jnp.asarray(rng.standard_normal((b, n, c)), dtype) for _ in range(layers))
    depth = rng.integers(0, n, b)                                                  # the last node's depth
    ext = np.arange(km1)[None] + depth[:, None] + 1                                # its window in a chain
    win = jnp.asarray(ext, jnp.int32)
    keep = np.arange(b) < max(1, b - 1) if keep is None else np.asarray(keep)
    return hists, conv_ins, win, jnp.asarray(keep)
