"""The GDN layer's output gate as one Pallas kernel (Triton lowering): the RMSNorm of the tree delta rule's output
and its silu(z) gate, with z read straight from the in_proj product, where XLA runs about three small kernels a
layer (o rounded to y's dtype, the norm, the gate; ~0.26 ms of a verify(16)'s kernels,
bench/results/2026-12-04-h200-s43/inputs-second-form/). Same contract as reference.py.

A program per (sequence, value head, 16 nodes): it reads its head's o [16, Dv] and z [16, Dv] (column offset of
its key-head group in y) and writes [16, Dv] of the [B, N, Hv Dv] output. N is padded to a multiple of 16 (padded
rows are zeros, normalised to zeros, and sliced off). Dv must be a power of two >= 16.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.gdn_decode.pallas_triton import sigmoid
from pallas_kernels.gdn_gated_norm.reference import layout

TILE = 16   # nodes a program


def supports(dv: int) -> bool:
    return dv >= 16 and dv & (dv - 1) == 0


def _kernel(o_ref, y_ref, w_ref, out_ref, *, dv, rep, gc, gw, eps):
    f32 = jnp.float32
    h = pl.program_id(1)
    kh = h // rep
    ob = o_ref[...].astype(out_ref.dtype).astype(f32)                  # [TILE, Dv]: the model normalises o in y's dtype
    normed = ob * lax.rsqrt(jnp.mean(ob * ob, axis=1) + eps)[:, None] * w_ref[...].astype(f32)[None, :]
    z = y_ref[:, pl.ds(kh * gw + gc + (h - kh * rep) * dv, dv)].astype(f32)
    out_ref[...] = (normed.astype(out_ref.dtype).astype(f32) * (z * sigmoid(z))).astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("dk", "eps", "interpret", "num_warps"))
def gdn_gated_norm(o, y, norm_w, *, dk: int, eps: float, interpret=False, num_warps=4):
    """Same contract as reference.gdn_gated_norm."""
    bsz, n, hv, dv = o.shape
    hk, rep, gc, gw = layout(o, y, dk)
    if not supports(dv):
        raise ValueError(f"gdn_gated_norm kernel takes a power-of-two value head dim >= 16, got Dv={dv}")
    n_pad = -(-n // TILE) * TILE
    if n_pad != n:
        o = jnp.pad(o, [(0, 0), (0, n_pad - n), (0, 0), (0, 0)])
        y = jnp.pad(y, [(0, 0), (0, n_pad - n), (0, 0)])
    out = pl.pallas_call(
        functools.partial(_kernel, dv=dv, rep=rep, gc=gc, gw=gw, eps=eps),
        out_shape=jax.ShapeDtypeStruct((bsz, n_pad, hv * dv), y.dtype),
        grid=(bsz, hv, n_pad // TILE),
        in_specs=[pl.BlockSpec((None, TILE, None, dv), lambda bi, hi, ti: (bi, ti, hi, 0)),
                  pl.BlockSpec((None, TILE, y.shape[-1]), lambda bi, hi, ti: (bi, ti, 0)),
                  pl.BlockSpec((dv,), lambda bi, hi, ti: (0,))],
        out_specs=pl.BlockSpec((None, TILE, dv), lambda bi, hi, ti: (bi, ti, hi)),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="gdn_gated_norm",
    )(o, y, norm_w)
    return out[:, :n]
