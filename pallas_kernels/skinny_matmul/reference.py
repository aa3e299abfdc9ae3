"""The spec of the skinny matmul: y = x @ w, what jaxspec/model.py's Linear has always computed (XLA)."""

from __future__ import annotations

import jax.numpy as jnp


def matmul(x, w):
    """x [..., K], w [K, N] -> [..., N] in their dtype, or their promotion when they differ (XLA accumulates bf16
    products in fp32)."""
    return jnp.einsum("...d,df->...f", x, w)
