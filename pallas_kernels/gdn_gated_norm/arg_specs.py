"""Shapes and inputs shared by the tests and the benchmark of the GDN output gate kernel."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

REAL = dict(hk=16, rep=3, dk=128, dv=128)   # Qwen3.6-27B's GDN layers: 16 key heads, 48 value heads
REAL_GDN_LAYERS = 48
EPS = 1e-6                                   # Qwen3.6's rms_norm_eps


def make_inputs(seed, b, n, hk, rep, dk, dv, dtype=jnp.float32):
    """(o, y, norm_w) with fresh random values (never zeros): o ~N(0, 1) fp32 with a scale per node and head (so
    the norm matters), the in_proj product y ~N(0, 1) in `dtype` at the grouped width, norm_w ~1 + N(0, 0.1)."""
    rng = np.random.default_rng(seed)
    hv = hk * rep
    w = hk * (2 * dk + rep * dv) + hv * dv + 2 * hv
    o = rng.standard_normal((b, n, hv, dv)) * rng.uniform(0.05, 5.0, (b, n, hv, 1))
    y = rng.standard_normal((b, n, w))
    norm_w = 1.0 + 0.1 * rng.standard_normal(dv)
    return (jnp.asarray(o, jnp.float32), jnp.asarray(y, jnp.float32).astype(dtype),
            jnp.asarray(norm_w, jnp.float32).astype(dtype))
