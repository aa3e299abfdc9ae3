"""The commit's GDN state update for one layer as one Pallas kernel (Triton lowering). Same contract as
reference.py.

Session 44's commit profile (bench/results/2026-12-04-h200-s44/engine-commit/commit/): XLA forms every layer's
update U = sum_j w_j k_j Delta_j^T in one product (0.063 ms, writing U for all 48 layers), then runs 48 fusions of
~4.6 us that read U and S0 and write S1 = e^{G_a} S0 + U, selected by keep: 0.28 ms of a 0.42 ms commit. A product
a layer did not let XLA fuse the rest into it (call 6 there). Here a program per (sequence, value head, slice of
the value dim) reads its S0 tile, the block's k and Delta columns and G, and writes S1: no U in memory, 6.3 MB a
layer moved instead of 9.4. S1 gets its own buffer: aliasing it to S0 would save memory, not bytes moved, and
costs a copy of S0 wherever the caller's state is not donated.

The weights w_j = anc_row_j e^{G_a - G_j} and G_a = G[last] are formed in the kernel; rows with keep False get
w = 0 and a factor 1, so S1 = S0 exactly. The contraction runs over all N nodes (non-ancestors weigh 0), a
[Dk, N] x [N, Dv] dot in fp32 (HIGHEST: the reference's arithmetic). N is padded to a power of two >= 16
(padded nodes are not ancestors).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.state_update.reference import check

TILE = 16    # Triton's dot wants every dimension >= 16


def supports(dk: int, dv: int) -> bool:
    pow2 = lambda d: d >= 16 and d & (d - 1) == 0
    return pow2(dk) and pow2(dv)


def _kernel(s0_ref, k_ref, d_ref, G_ref, anc_ref, last_ref, keep_ref, out_ref, *, n_pad, precision):
    f32 = jnp.float32
    G = G_ref[...]                                                   # [N] this head's cumulated log-decay
    node = lax.broadcasted_iota(jnp.int32, (n_pad,), 0)
    last = jnp.sum(last_ref[...])                                    # [1] blocks
    keep = jnp.sum(keep_ref[...]) > 0
    G_a = jnp.sum(jnp.where(node == last, G, 0.0))
    on = (anc_ref[...] > 0) & keep
    w = jnp.where(on, jnp.exp(jnp.where(on, G_a - G, 0.0)), 0.0)     # [N]
    wd = w[:, None] * d_ref[...]                                     # [N, bdv]
    u = lax.dot_general(k_ref[...], wd, (((0,), (0,)), ((), ())), precision=precision,
                        preferred_element_type=f32)                  # [Dk, bdv]
    out_ref[...] = jnp.where(keep, jnp.exp(G_a), 1.0) * s0_ref[...] + u


def _path_kernel(s0_ref, k_ref, d_ref, G_ref, idx_ref, count_ref, last_ref, keep_ref, out_ref):
    """The path form: a loop over the accepted path's nodes only (idx_ref holds them first, count_ref how many),
    one rank-1 update e^{G_a - G_j} k_j Delta_j^T each, in fp32 FMAs. A chain of 16 or a tree's path of depth d
    costs d updates, where the dot form contracts over all N nodes."""
    last = jnp.sum(last_ref[...])
    keep = jnp.sum(keep_ref[...]) > 0
    G_a = G_ref[last]

    def body(i, acc):
        j = idx_ref[i]
        w = jnp.exp(G_a - G_ref[j])
        return acc + (w * k_ref[j, :])[:, None] * d_ref[j, :][None, :]

    init = jnp.where(keep, jnp.exp(G_a), 1.0) * s0_ref[...]
    out_ref[...] = lax.fori_loop(0, jnp.where(keep, jnp.sum(count_ref[...]), 0), body, init)


@functools.partial(jax.jit, static_argnames=("interpret", "block_dv", "num_warps", "form"))
def state_update(s0, k, delta, G, anc_row, last, keep, *, interpret=False, block_dv=64, num_warps=4, form="path"):
    """Same contract as reference.state_update. block_dv: value columns per program (a power of two >= 16,
    clipped to Dv). form: "path" (a rank-1 update per accepted node) or "dot" (one contraction over all N)."""
    check(s0, k, delta, G, anc_row, last, keep)
    b, h, dk, dv = s0.shape
    n, hk = G.shape[1], k.shape[2]
    rep = h // hk
    if not supports(dk, dv):
        raise ValueError(f"state_update kernel takes power-of-two head dims >= 16, got Dk={dk}, Dv={dv}")
    if form not in ("path", "dot"):
        raise ValueError(f"state_update: form must be 'path' or 'dot', got {form!r}")
    if block_dv < 16 or block_dv & (block_dv - 1):
        raise ValueError(f"state_update: block_dv must be a power of two >= 16, got {block_dv}")
    bdv = min(block_dv, dv)
    f32, i32 = jnp.float32, jnp.int32
    n_pad = max(TILE, pl.next_power_of_2(n))     # Triton's arrays: power-of-two sizes
    pad = n_pad - n
    k, delta, G, anc = k.astype(f32), delta.astype(f32), G.astype(f32), anc_row.astype(f32)
    if pad:   # padded nodes are no ancestors: weight 0
        k = jnp.pad(k, [(0, 0), (0, pad), (0, 0), (0, 0)])
        delta = jnp.pad(delta, [(0, 0), (0, pad), (0, 0), (0, 0)])
        G = jnp.pad(G, [(0, 0), (0, pad), (0, 0)])
        anc = jnp.pad(anc, [(0, 0), (0, pad)])
    row = lambda: pl.BlockSpec((1,), lambda bi, hi, vi: (bi,))
    tile = pl.BlockSpec((None, None, dk, bdv), lambda bi, hi, vi: (bi, hi, 0, vi))
    nodes = [pl.BlockSpec((None, n_pad, None, dk), lambda bi, hi, vi: (bi, 0, hi // rep, 0)),
             pl.BlockSpec((None, n_pad, None, bdv), lambda bi, hi, vi: (bi, 0, hi, vi)),
             pl.BlockSpec((None, n_pad, None), lambda bi, hi, vi: (bi, 0, hi))]
    if form == "dot":
        kernel = functools.partial(_kernel, n_pad=n_pad, precision=lax.Precision.HIGHEST)
        per_row = [pl.BlockSpec((None, n_pad), lambda bi, hi, vi: (bi, 0))]
        extra = (anc,)
    else:   # the path's nodes first, in order (a stable sort of "not an ancestor"), and their count
        kernel = _path_kernel
        on = anc > 0
        per_row = [pl.BlockSpec((None, n_pad), lambda bi, hi, vi: (bi, 0)), row()]
        extra = (jnp.argsort(~on, axis=1, stable=True).astype(i32), jnp.sum(on, axis=1, dtype=i32))
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((b, h, dk, dv), f32),
        grid=(b, h, dv // bdv),
        in_specs=[tile, *nodes, *per_row, row(), row()],
        out_specs=tile,
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="state_update",
    )(s0.astype(f32), k, delta, G, *extra, last.astype(i32), keep.astype(i32))
