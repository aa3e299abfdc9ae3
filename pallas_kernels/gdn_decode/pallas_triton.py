"""One Gated DeltaNet decode step as one Pallas kernel (Triton lowering): a program per (sequence, value
head) does the conv window, silu, l2norms, gates, the one-node delta rule against the head's state and
the gated RMSNorm, where XLA runs about a dozen small kernels per layer (conv gathers, norms, gates, two
state contractions, the norm, the gate; bench/results/2026-11-29-h200-ar-step: 1.03 ms of the 15 ms
step in ~670 kernels). Same contract as reference.gdn_decode.

The program reads its key head's q and k channels and its own v channels of the conv window straight
from the [B, C] / [B, K-1, C] rows (dynamic slices), its [Dk, Dv] state once for both contractions
(S0^T k and S0^T q as broadcast-multiply + column sums: a one-row dot is below Triton's 16-row minimum),
and writes out, Delta and G; the first of each key head's rep programs writes its k. Dk and Dv must be
powers of two (Triton's loads), as at the real shape (128) and the demo's (32).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.gdn_decode.reference import check_args

PACK = 4    # per value head scalars in: a, b, A_log, dt_bias; out: G (repeated)


def supports(dk: int, dv: int) -> bool:
    pow2 = lambda d: d >= 1 and d & (d - 1) == 0
    return pow2(dk) and pow2(dv)


def sigmoid(x):
    return 1.0 / (1.0 + jnp.exp(-x))


def log_decay(a, a_log, dt_bias):
    """The GDN gate g = -exp(A_log) softplus(a + dt_bias), softplus in the overflow-free form, in kernel code."""
    x = a + dt_bias
    return -jnp.exp(a_log) * (jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x))))


def _kernel(x_ref, hist_ref, w_ref, z_ref, p_ref, nw_ref, s0_ref, out_ref, k_ref, d_ref, g_ref, *,
            dk, dv, rep, kw, eps, aligned):
    f32 = jnp.float32
    h = pl.program_id(1)
    kh = h // rep
    base = kh * (2 * dk + rep * dv)

    def conv(off, n):
        if aligned:
            off = pl.multiple_of(off, 16)
        cs = pl.ds(off, n)
        acc = x_ref[cs].astype(f32) * w_ref[kw - 1, cs].astype(f32)
        for j in range(kw - 1):
            acc = acc + hist_ref[j, cs].astype(f32) * w_ref[j, cs].astype(f32)
        return acc * sigmoid(acc)

    q = conv(base, dk)
    k = conv(base + dk, dk)
    v = conv(base + 2 * dk + (h - kh * rep) * dv, dv)
    q = q * lax.rsqrt(jnp.sum(q * q) + 1e-6) * (dk ** -0.5)
    k = k * lax.rsqrt(jnp.sum(k * k) + 1e-6)

    p = p_ref[...].astype(f32)
    lane = lax.broadcasted_iota(jnp.int32, (PACK,), 0)
    a, b, a_log, dt_bias = (jnp.sum(jnp.where(lane == i, p, 0.0)) for i in range(PACK))
    g = log_decay(a, a_log, dt_bias)
    beta = sigmoid(b)
    eg = jnp.exp(g)

    s0 = s0_ref[...]                                              # [Dk, Dv] fp32
    ks = jnp.sum(k[:, None] * s0, axis=0)                         # S0^T k  [Dv]
    qs = jnp.sum(q[:, None] * s0, axis=0)
    delta = beta * (v - eg * ks)
    o = eg * qs + jnp.sum(q * k) * delta

    ob = o.astype(out_ref.dtype).astype(f32)
    n = (ob * lax.rsqrt(jnp.mean(ob * ob) + eps) * nw_ref[...].astype(f32)).astype(out_ref.dtype).astype(f32)
    zf = z_ref[...].astype(f32)
    out_ref[...] = (n * zf * sigmoid(zf)).astype(out_ref.dtype)
    d_ref[...] = delta
    g_ref[...] = jnp.full((PACK,), g, f32)

    @pl.when(h == kh * rep)
    def _():
        k_ref[...] = k


@functools.partial(jax.jit, static_argnames=("eps", "interpret", "num_warps"))
def gdn_decode(conv_in, history, conv_w, z, a, b, A_log, dt_bias, norm_w, s0, *, eps: float, interpret=False,
               num_warps=4):
    """Same contract as reference.gdn_decode. num_warps: 4, the faster of the two bench.py times on the
    H200 (26.2 against 30.4 us a layer, 48 layers in one jit; bench/results/2026-11-30-h200-kernel-flags)."""
    hk, rep, dk, dv = check_args(conv_in, history, conv_w, z, a, b, A_log, dt_bias, norm_w, s0)
    if not supports(dk, dv):
        raise ValueError(f"gdn_decode kernel takes power-of-two head dims, got Dk={dk}, Dv={dv}")
    bsz, c = conv_in.shape
    hv, kw = hk * rep, conv_w.shape[0]
    f32 = jnp.float32
    pack = jnp.stack([a.astype(f32), b.astype(f32), jnp.broadcast_to(A_log.astype(f32), (bsz, hv)),
                      jnp.broadcast_to(dt_bias.astype(f32), (bsz, hv))], -1)               # [B, Hv, 4]
    per_head = lambda *blk: pl.BlockSpec((None, None) + blk, lambda bi, hi: (bi, hi) + (0,) * len(blk))
    out, k, delta, g = pl.pallas_call(
        functools.partial(_kernel, dk=dk, dv=dv, rep=rep, kw=kw, eps=eps,
                          aligned=dk % 16 == 0 and dv % 16 == 0),
        out_shape=(jax.ShapeDtypeStruct((bsz, hv, dv), conv_in.dtype),
                   jax.ShapeDtypeStruct((bsz, hk, dk), f32),
                   jax.ShapeDtypeStruct((bsz, hv, dv), f32),
                   jax.ShapeDtypeStruct((bsz, hv, PACK), f32)),
        grid=(bsz, hv),
        in_specs=[pl.BlockSpec((None, c), lambda bi, hi: (bi, 0)),
                  pl.BlockSpec((None, kw - 1, c), lambda bi, hi: (bi, 0, 0)),
                  pl.BlockSpec((kw, c), lambda bi, hi: (0, 0)),
                  per_head(dv), per_head(PACK),
                  pl.BlockSpec((dv,), lambda bi, hi: (0,)),
                  per_head(dk, dv)],
        out_specs=[per_head(dv), pl.BlockSpec((None, None, dk), lambda bi, hi: (bi, hi // rep, 0)),
                   per_head(dv), per_head(PACK)],
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="gdn_decode",
    )(conv_in, history, conv_w, z, pack, norm_w, s0.astype(f32))
    return out, k, delta, g[..., 0]
