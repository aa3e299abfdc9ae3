"""The block's causal self-attention by cuDNN's fused flash attention (through jax's cuDNN binding).

At the real shape (24 query heads over 4 kv heads of 256, bf16) a chain of 8192 nodes took 1.555 ms a layer on an
H100 against the tree attention kernel's 6.195 (530 against 133 TFLOP/s on the causal half), the same largest error
against the fp32 reference (bench/results/2026-12-06-h100-s63/call2/). jax's public `jax.nn.dot_product_attention`
returns the log-sum-exp cast to the output's dtype (bf16), too coarse to merge with the prefix (its spacing at 8-16 is
1/16: 6% in a weight); its cuDNN binding returns it in fp32, so that is what runs here."""

from __future__ import annotations

import math

import jax.numpy as jnp


def available() -> bool:
    """Whether this jax has the cuDNN binding this module calls."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo  # noqa: F401
    except ImportError:
        return False
    return True


def supports(q, keys) -> bool:
    """Shapes and dtypes cuDNN's fused attention takes for nodes q [B, N, H, hd] over a cache keys [B, L, KV, hd]
    (q and the block's keys run in the cache's dtype): a 16-bit cache, head_dim <= 256 and a multiple of 8."""
    hd = q.shape[-1]
    return keys.dtype.itemsize == 2 and jnp.issubdtype(keys.dtype, jnp.floating) and hd <= 256 and hd % 8 == 0


def self_attention(q, k, v):
    """Same contract as reference.self_attention, on the GPU."""
    from jax._src.cudnn.fused_attention_stablehlo import MaskType, dot_product_attention
    o, lse = dot_product_attention(q, k, v, scale=1.0 / math.sqrt(q.shape[-1]), mask_type=MaskType.CAUSAL,
                                   qkv_layout="BTNH", return_residual=True)
    return o, lse.swapaxes(1, 2)                      # cuDNN gives the statistics as [B, H, N]
