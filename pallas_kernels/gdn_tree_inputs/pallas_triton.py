"""The GDN layer's inputs to the tree delta rule as one Pallas kernel (Triton lowering): the conv along the tree,
silu, the l2 norms and the gates, where XLA runs about nine small kernels a layer (slices of the in_proj product,
the history concatenated, the window gathers, norms, gates, transposes). Same contract as reference.py.

A program per (sequence, channel group, tile of 16 nodes). The channel groups are each key head's q, its k and
its rep value heads' v (Hk (2 + rep) groups: 80 at the real shape), so every program convolves one head's
channels for 16 nodes and the grid fills the GPU at every block size. Session 43's first form, a program per
value head over all N nodes with q and k on the first of each rep, ran 48 programs with [N, 128] fp32 tiles
and took 14 / 67 us a layer at N = 16 / 64 on the H200 against ~8 / ~12 us of XLA kernels
(bench/results/2026-12-04-h200-s43/).

A program reads its channels straight from the in_proj product y (column offsets of its group), so no slice of
y is materialised. The conv along the tree is a sum over distances d of one-hot selections: the tile's window
rows as a [16, N] one-hot matrix times the block's inputs [N, width], the history rows as K-1 masked broadcasts.
The selection dot runs in y's dtype with fp32 accumulation, exact either way (one nonzero term per row): on
the tensor cores for bf16, full fp32 for fp32. N is padded to a power of two from 16 to 128 (Triton's loads and
dot); padded nodes read themselves and are sliced off. Dk and Dv must be powers of two >= 16. The value heads'
programs also write their head's g and beta.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.gdn_decode.pallas_triton import log_decay, sigmoid
from pallas_kernels.gdn_tree_inputs.reference import layout

MAX_N = 128
TILE = 16   # nodes a program (the smallest tl.dot)


def supports(n: int, dk: int, dv: int) -> bool:
    pow2 = lambda d: d >= 16 and d & (d - 1) == 0
    return 1 <= n <= MAX_N and pow2(dk) and pow2(dv)


def _kernel(y_ref, hist_ref, w_ref, alog_ref, dtb_ref, rows_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, *,
            dk, dv, rep, gc, gw, kw, n_pad, precision):
    f32 = jnp.float32
    group, tile = pl.program_id(1), pl.program_id(2)
    kh = group // (rep + 2)
    j = group - kh * (rep + 2)                                     # 0: q, 1: k, 2..: value head j - 2
    here = pl.ds(tile * TILE, TILE)
    node = lax.broadcasted_iota(jnp.int32, (TILE, n_pad), 1)
    rows = [rows_ref[d, here] for d in range(kw)]                  # [TILE] each: concat(history, nodes) indices

    def conv(c, width):
        """silu of the conv along the tree for the tile's nodes, channels [c, c + width) of the group."""
        ys, cs = pl.ds(kh * gw + c, width), pl.ds(kh * gc + c, width)
        x = y_ref[:, ys]                                            # [N, width] the block's inputs
        acc = y_ref[here, ys].astype(f32) * w_ref[kw - 1, cs].astype(f32)[None, :]
        for d in range(1, kw):
            pick = jnp.where(rows[d][:, None] == node + (kw - 1), 1.0, 0.0).astype(x.dtype)
            taken = lax.dot_general(pick, x, (((1,), (0,)), ((), ())), precision=precision,
                                    preferred_element_type=f32)
            for i in range(kw - 1):
                taken = taken + jnp.where(rows[d] == i, 1.0, 0.0)[:, None] * hist_ref[i, cs].astype(f32)[None, :]
            acc = acc + taken * w_ref[kw - 1 - d, cs].astype(f32)[None, :]
        return acc * sigmoid(acc)

    l2 = lambda t: t * lax.rsqrt(jnp.sum(t * t, axis=1) + 1e-6)[:, None]

    @pl.when(j == 0)
    def _():
        q_ref[...] = l2(conv(0, dk)) * (dk ** -0.5)

    @pl.when(j == 1)
    def _():
        k_ref[...] = l2(conv(dk, dk))

    @pl.when(j >= 2)
    def _():
        r = j - 2
        v_ref[...] = conv(2 * dk + r * dv, dv)
        gate = kh * gw + gc + rep * dv + r
        b_in, a = y_ref[here, gate].astype(f32), y_ref[here, gate + rep].astype(f32)
        a_log, dt_bias = (jnp.sum(ref[...].astype(f32)) for ref in (alog_ref, dtb_ref))   # [1] blocks
        g_ref[...] = log_decay(a, a_log, dt_bias)
        beta_ref[...] = sigmoid(b_in)


@functools.partial(jax.jit, static_argnames=("dk", "dv", "interpret", "num_warps"))
def gdn_tree_inputs(y, history, conv_w, A_log, dt_bias, rows, *, dk: int, dv: int, interpret=False, num_warps=4):
    """Same contract as reference.gdn_tree_inputs."""
    hk, rep, gc, gw = layout(y, history, conv_w, A_log, dt_bias, rows, dk, dv)
    bsz, n, _ = y.shape
    if not supports(n, dk, dv):
        raise ValueError(f"gdn_tree_inputs kernel takes 1..{MAX_N} nodes and power-of-two head dims >= 16, got "
                         f"N={n}, Dk={dk}, Dv={dv}")
    hv, kw = hk * rep, conv_w.shape[0]
    f32 = jnp.float32
    n_pad = max(TILE, pl.next_power_of_2(n))
    if n_pad != n:   # padded nodes read their own (zero) inputs
        y = jnp.pad(y, [(0, 0), (0, n_pad - n), (0, 0)])
        own = jnp.broadcast_to(kw - 1 + jnp.arange(n, n_pad, dtype=jnp.int32), (bsz, kw, n_pad - n))
        rows = jnp.concatenate([rows.astype(jnp.int32), own], 2)
    groups = rep + 2

    def out(head, *blk):
        """Output block of the tile's nodes at the head `head(key head, j)` (v heads clamp for q / k programs,
        which do not write them)."""
        return pl.BlockSpec((None, TILE, None) + blk,
                            lambda bi, gi, ti: (bi, ti, head(gi // groups, gi % groups)) + (0,) * len(blk))

    v_head = lambda kh, j: kh * rep + jnp.maximum(j - 2, 0)
    # A_log and dt_bias [Hv] in their own dtype, one element a program: no stacked copy (an XLA kernel a layer).
    head_param = pl.BlockSpec((1,), lambda bi, gi, ti: (v_head(gi // groups, gi % groups),))
    q, k, v, g, beta = pl.pallas_call(
        functools.partial(_kernel, dk=dk, dv=dv, rep=rep, gc=gc, gw=gw, kw=kw, n_pad=n_pad,
                          precision=lax.Precision.HIGHEST if y.dtype == f32 else lax.Precision.DEFAULT),
        out_shape=(jax.ShapeDtypeStruct((bsz, n_pad, hk, dk), f32),
                   jax.ShapeDtypeStruct((bsz, n_pad, hk, dk), f32),
                   jax.ShapeDtypeStruct((bsz, n_pad, hv, dv), f32),
                   jax.ShapeDtypeStruct((bsz, n_pad, hv), f32),
                   jax.ShapeDtypeStruct((bsz, n_pad, hv), f32)),
        grid=(bsz, hk * groups, n_pad // TILE),
        in_specs=[pl.BlockSpec((None, n_pad, y.shape[-1]), lambda bi, gi, ti: (bi, 0, 0)),
                  pl.BlockSpec((None, kw - 1, conv_w.shape[1]), lambda bi, gi, ti: (bi, 0, 0)),
                  pl.BlockSpec(conv_w.shape, lambda bi, gi, ti: (0, 0)),
                  head_param, head_param,
                  pl.BlockSpec((None, kw, n_pad), lambda bi, gi, ti: (bi, 0, 0))],
        out_specs=[out(lambda kh, j: kh, dk), out(lambda kh, j: kh, dk), out(v_head, dv), out(v_head), out(v_head)],
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="gdn_tree_inputs",
    )(y, history, conv_w, A_log, dt_bias, rows.astype(jnp.int32))
    return q[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n]
