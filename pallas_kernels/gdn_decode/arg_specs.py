"""Shapes and inputs shared by the tests and the benchmark of the fused GDN decode step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

REAL = dict(hk=16, rep=3, dk=128, dv=128, kw=4)   # Qwen3.6-27B's GDN layers: 16 key heads, 48 value heads
REAL_GDN_LAYERS = 48


def shapes(b, hk, rep, dk, dv, kw, dtype=jnp.bfloat16):
    """ShapeDtypeStructs of gdn_decode's arguments, in order."""
    hv, c = hk * rep, hk * (2 * dk + rep * dv)
    S = jax.ShapeDtypeStruct
    return (S((b, c), dtype), S((b, kw - 1, c), dtype), S((kw, c), dtype), S((b, hv, dv), dtype),
            S((b, hv), dtype), S((b, hv), dtype), S((hv,), jnp.float32), S((hv,), jnp.float32),
            S((dv,), dtype), S((b, hv, dk, dv), jnp.float32))


def make_inputs(seed, b, hk, rep, dk, dv, kw, dtype=jnp.float32):
    """Fresh random arguments (never zeros): conv inputs and gates ~N(0, 1), conv taps ~N(0, 0.25),
    states ~N(0, 0.01)."""
    rng = np.random.default_rng(seed)
    scale = {2: 0.5, 9: 0.1}                                     # conv_w, s0
    return tuple(jnp.asarray(rng.standard_normal(s.shape) * scale.get(i, 1.0), jnp.float32).astype(s.dtype)
                 for i, s in enumerate(shapes(b, hk, rep, dk, dv, kw, dtype)))
