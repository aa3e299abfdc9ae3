"""Pure-jnp reference of the residual add followed by RMSNorm, as every decoder layer of the target does
twice, in the deferred form the model runs (jaxspec/model.py RMSNorm.deferred; offset 1.0 is Qwen3.5's
zero-centred form): s = x + u in the stream's dtype; h = s * (offset + w) in fp32, cast back; and the row
scale r = 1 / sqrt(mean(s^2) + eps) in fp32, left for the product that h feeds, so that
RMSNorm(s) @ W = (h @ W) * r up to rounding.

u is the update [..., D] in x's dtype, or the K slices of the product that made it, [S, ..., D] (any float
dtype; jaxspec.model.Linear with `slices`): then s = x + the slices' sum, taken in fp32 and rounded once."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def add(x, u):
    """x + u in x's dtype, u the update or its slices [S, ..., D] (summed in fp32, the sum rounded once)."""
    if u.ndim == x.ndim:
        return x + u
    return (x.astype(jnp.float32) + jnp.sum(u.astype(jnp.float32), 0)).astype(x.dtype)


def add_rms_norm(x, u, w, *, eps: float, offset: float):
    """x [..., D], u [..., D] in x's dtype or slices [S, ..., D], w [D]. Returns (x + u and h [..., D] in x's
    dtype, r [..., 1] fp32)."""
    s = add(x, u)
    sf = s.astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.mean(sf * sf, -1, keepdims=True) + eps)
    return s, (sf * (offset + w.astype(jnp.float32))).astype(x.dtype), r
