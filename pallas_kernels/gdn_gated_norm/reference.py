"""Pure-jnp reference of the GDN layer's output gate for a block of N tree nodes: the spec of the kernel, and what
jaxspec/model.py's GatedDeltaNet runs off the GPU.

From the tree delta rule's output o [B, N, Hv, Dv] (fp32) and the in_proj product y [B, N, W] (the grouped layout
of pallas_kernels/gdn_tree_inputs: per key head, [conv channels, z of its rep value heads, b, a]), per value head:

    n   = RMSNorm(o rounded to y's dtype) * norm_w      in fp32, rounded to y's dtype
    out = n * silu(z)                                   in fp32, rounded to y's dtype

which is what pallas_kernels/gdn_decode does for one token (the model normalises o in its own dtype). The output
[B, N, Hv Dv] is out_proj's input.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.gdn_tree_inputs.reference import groups


def layout(o, y, dk: int):
    """gdn_tree_inputs' `groups` from o [B, N, Hv, Dv] and y [B, N, W] (whose width gives the conv channels)."""
    hv, dv = o.shape[2:]
    if o.shape[:2] != y.shape[:2]:
        raise ValueError(f"gdn_gated_norm: o {tuple(o.shape)} and the in_proj product {tuple(y.shape)} differ in "
                         f"batch or nodes")
    w = y.shape[-1]
    return groups("gdn_gated_norm", w, w - hv * dv - 2 * hv, hv, dk, dv)


def z_columns(y, hk: int, rep: int, gc: int, dv: int):
    """z [B, N, Hv, Dv] from the in_proj product's key-head groups (gc conv channels a group, then z)."""
    b, n, w = y.shape
    return y.reshape(b, n, hk, w // hk)[..., gc:gc + rep * dv].reshape(b, n, hk * rep, dv)


def gdn_gated_norm(o, y, norm_w, *, dk: int, eps: float):
    """o [B, N, Hv, Dv] fp32; y [B, N, W] the in_proj product; norm_w [Dv]; dk the key head dim (it fixes the
    layout). Returns [B, N, Hv Dv] in y's dtype."""
    f32, dt = jnp.float32, y.dtype
    b, n, hv, dv = o.shape
    hk, rep, gc, _ = layout(o, y, dk)
    z = z_columns(y, hk, rep, gc, dv).astype(f32)
    ob = o.astype(dt).astype(f32)
    normed = (ob * jax.lax.rsqrt(jnp.mean(ob * ob, -1, keepdims=True) + eps) * norm_w.astype(f32)).astype(dt)
    return (normed.astype(f32) * jax.nn.silu(z)).astype(dt).reshape(b, n, hv * dv)
