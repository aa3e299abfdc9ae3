"""Pure-jnp reference of the residual add followed by RMSNorm, as every decoder layer of the target does
twice: s = x + u in the stream's dtype, then RMSNorm(s) in fp32 with weight (offset + w), cast back
(jaxspec/model.py RMSNorm; offset 1.0 is Qwen3.5's zero-centred form)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def add_rms_norm(x, u, w, *, eps: float, offset: float):
    """x, u [..., D] (same dtype), w [D]. Returns (x + u, RMSNorm(x + u)), both in x's dtype."""
    s = x + u
    sf = s.astype(jnp.float32)
    n = sf * jax.lax.rsqrt(jnp.mean(sf * sf, -1, keepdims=True) + eps)
    return s, (n * (offset + w.astype(jnp.float32))).astype(x.dtype)
