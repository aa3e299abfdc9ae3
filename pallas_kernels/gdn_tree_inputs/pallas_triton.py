"""The GDN layer's inputs to the tree delta rule as one Pallas kernel (Triton lowering): a program per
(sequence, value head) does the conv along the tree, silu, the l2 norms and the gates for its value head and
its key head, where XLA runs about nine small kernels a layer (slices of the in_proj product, the history
concatenated, the window gathers, norms, gates, transposes: 0.83 ms of a verify(16)'s kernels besides the
delta rule, bench/results/2026-12-04-h200-s42/tdr-kernel/verify-new/). Same contract as reference.py.

The program reads its channels straight from the in_proj product y (column offsets of its group), so no
slice of y is materialised. The conv along the tree is a sum over distances d of one-hot selections: the
window's node rows as a [N, N] one-hot matrix times the block's own inputs, its history rows as K-1 masked
broadcasts. The selection dot runs in y's dtype with fp32 accumulation, exact either way (one nonzero term per
row): on the tensor cores for bf16 (at N = 64 FMA dots would cost ~19 us a program), full fp32 for fp32. N is padded to a power of two from 16 to 128 (Triton's
loads and dot); padded nodes read themselves and are sliced off. Dk and Dv must be powers of two >= 16.
The first of each key head's rep programs writes its q and k.
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


def supports(n: int, dk: int, dv: int) -> bool:
    pow2 = lambda d: d >= 16 and d & (d - 1) == 0
    return 1 <= n <= MAX_N and pow2(dk) and pow2(dv)


def _kernel(y_ref, hist_ref, w_ref, p_ref, rows_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, *,
            dk, dv, rep, gc, gw, kw, n_pad, precision):
    f32 = jnp.float32
    h = pl.program_id(1)
    kh = h // rep
    r = h - kh * rep
    node = lax.broadcasted_iota(jnp.int32, (n_pad, n_pad), 1)
    rows = [rows_ref[d, :] for d in range(kw)]                     # [N] each: concat(history, nodes) indices

    def conv(c, width):
        """silu of the conv along the tree for channels [c, c + width) of the group."""
        ys, cs = pl.ds(kh * gw + c, width), pl.ds(kh * gc + c, width)
        x = y_ref[:, ys]                                            # [N, width] the nodes' own inputs
        acc = x.astype(f32) * w_ref[kw - 1, cs].astype(f32)[None, :]
        for d in range(1, kw):
            pick = jnp.where(rows[d][:, None] == node + (kw - 1), 1.0, 0.0).astype(x.dtype)
            taken = lax.dot_general(pick, x, (((1,), (0,)), ((), ())), precision=precision,
                                    preferred_element_type=f32)
            for j in range(kw - 1):
                taken = taken + jnp.where(rows[d] == j, 1.0, 0.0)[:, None] * hist_ref[j, cs].astype(f32)[None, :]
            acc = acc + taken * w_ref[kw - 1 - d, cs].astype(f32)[None, :]
        return acc * sigmoid(acc)

    l2 = lambda t: t * lax.rsqrt(jnp.sum(t * t, axis=1) + 1e-6)[:, None]
    v_ref[...] = conv(2 * dk + r * dv, dv)

    @pl.when(r == 0)
    def _():
        q_ref[...] = l2(conv(0, dk)) * (dk ** -0.5)
        k_ref[...] = l2(conv(dk, dk))

    gate = kh * gw + gc + rep * dv + r
    b_in, a = y_ref[:, gate].astype(f32), y_ref[:, gate + rep].astype(f32)
    p = p_ref[...].astype(f32)
    lane = lax.broadcasted_iota(jnp.int32, (2,), 0)
    a_log, dt_bias = (jnp.sum(jnp.where(lane == i, p, 0.0)) for i in range(2))
    g_ref[...] = log_decay(a, a_log, dt_bias)
    beta_ref[...] = sigmoid(b_in)


@functools.partial(jax.jit, static_argnames=("dk", "dv", "interpret", "num_warps"))
def gdn_tree_inputs(y, history, conv_w, A_log, dt_bias, rows, *, dk: int, dv: int, interpret=False, num_warps=4):
    """Same contract as reference.gdn_tree_inputs."""
    hk, rep, gc, gw = layout(y, conv_w, A_log, dk, dv)
    bsz, n, _ = y.shape
    if not supports(n, dk, dv):
        raise ValueError(f"gdn_tree_inputs kernel takes 1..{MAX_N} nodes and power-of-two head dims >= 16, got "
                         f"N={n}, Dk={dk}, Dv={dv}")
    hv, kw = hk * rep, conv_w.shape[0]
    f32 = jnp.float32
    n_pad = max(16, pl.next_power_of_2(n))
    if n_pad != n:   # padded nodes read their own (zero) inputs
        y = jnp.pad(y, [(0, 0), (0, n_pad - n), (0, 0)])
        own = jnp.broadcast_to(kw - 1 + jnp.arange(n, n_pad, dtype=jnp.int32), (bsz, kw, n_pad - n))
        rows = jnp.concatenate([rows.astype(jnp.int32), own], 2)
    pack = jnp.stack([A_log.astype(f32), dt_bias.astype(f32)], -1)                        # [Hv, 2]
    nodes = lambda *blk, head=lambda hi: hi: pl.BlockSpec(
        (None, n_pad, None) + blk, lambda bi, hi: (bi, 0, head(hi)) + (0,) * len(blk))
    q, k, v, g, beta = pl.pallas_call(
        functools.partial(_kernel, dk=dk, dv=dv, rep=rep, gc=gc, gw=gw, kw=kw, n_pad=n_pad,
                          precision=lax.Precision.HIGHEST if y.dtype == f32 else lax.Precision.DEFAULT),
        out_shape=(jax.ShapeDtypeStruct((bsz, n_pad, hk, dk), f32),
                   jax.ShapeDtypeStruct((bsz, n_pad, hk, dk), f32),
                   jax.ShapeDtypeStruct((bsz, n_pad, hv, dv), f32),
                   jax.ShapeDtypeStruct((bsz, n_pad, hv), f32),
                   jax.ShapeDtypeStruct((bsz, n_pad, hv), f32)),
        grid=(bsz, hv),
        in_specs=[pl.BlockSpec((None, n_pad, y.shape[-1]), lambda bi, hi: (bi, 0, 0)),
                  pl.BlockSpec((None, kw - 1, conv_w.shape[1]), lambda bi, hi: (bi, 0, 0)),
                  pl.BlockSpec(conv_w.shape, lambda bi, hi: (0, 0)),
                  pl.BlockSpec((None, 2), lambda bi, hi: (hi, 0)),
                  pl.BlockSpec((None, kw, n_pad), lambda bi, hi: (bi, 0, 0))],
        out_specs=[nodes(dk, head=lambda hi: hi // rep), nodes(dk, head=lambda hi: hi // rep), nodes(dv),
                   nodes(), nodes()],
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="gdn_tree_inputs",
    )(y, history, conv_w, pack, rows.astype(jnp.int32))
    return q[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n]
