"""The tree delta rule on a chain of a few nodes (a DFlash block of 16) as the recurrence itself, in one kernel.

For a chain the ancestor-masked WY form (pallas_triton.py: the Gram product, prepare, apply; three launches, each
program's time a serial chain of [16, 16] dots) computes what the token-by-token recurrence does:

    S <- e^{g_t} S;    Delta_t = beta_t (v_t - k_t^T S);    S <- S + k_t Delta_t^T;    o_t = q_t^T S

A program per (batch row, value head, slice of block_dv value columns) holds its [Dk, block_dv] slice of the state
in registers and walks the chain's nodes, unrolled: per node two reductions over Dk and two rank-one updates, no
dot, no shared-memory tile of a triangular factor. Returns what `reference.tree_delta_rule` returns for a chain:
o, Delta and G (the cumulative log-decay).

Opt-in (JAXSPEC_TREE_DELTA_RULE=pallas_recurrent): a chain of at most MAX_N nodes runs this kernel, any other block
the WY kernels. Written in session 66 without a GPU: not yet timed. The reasoning: at N = 16 the WY kernels take
19.26 us a GDN layer on the H200 (bench/results/2026-12-06-h200-s60/table/), 0.92 ms of a DFlash round's verify
over 48 layers; 16 steps of two cross-warp reductions (~0.3-0.5 us a step) would take ~6-10 us.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.tree_delta_rule import reference

MAX_N = 32          # nodes unrolled in one program; a DFlash block is 16


def supports(n: int) -> bool:
    return 1 <= n <= MAX_N


def _pow2_at_least_16(d: int) -> int:
    return max(16, pl.next_power_of_2(d))


def _recurrent_kernel(q_ref, k_ref, v_ref, g_ref, beta_ref, s0_ref, o_ref, delta_ref, *, n):
    """One program: the state slice s [Dkp, block_dv] in registers through the chain's n nodes (static, unrolled).
    g and beta are loaded whole ([n_pad] columns) and each node's scalar picked by a mask: no load depends on a
    loop index."""
    s = s0_ref[...]
    rows = lax.broadcasted_iota(jnp.int32, g_ref.shape, 0)
    g_all, beta_all = g_ref[...], beta_ref[...]
    for t in range(n):
        pick = lambda x: jnp.sum(jnp.where(rows == t, x, 0.0))
        k_t, q_t = k_ref[t, :], q_ref[t, :]
        s = jnp.exp(pick(g_all)) * s
        d = pick(beta_all) * (v_ref[t, :] - jnp.sum(k_t[:, None] * s, axis=0))
        s = s + k_t[:, None] * d[None, :]
        delta_ref[t, :] = d
        o_ref[t, :] = jnp.sum(q_t[:, None] * s, axis=0)


@functools.partial(jax.jit, static_argnames=("interpret", "block_dv", "num_warps"))
def chain_delta_rule(q, k, v, g, beta, s0, *, interpret=False, block_dv=32, num_warps=4):
    """`reference.tree_delta_rule` for a chain (anc lower-triangular) of N <= MAX_N nodes: q, k [B, N, Hk, Dk],
    v [B, N, H, Dv], g, beta [B, N, H], s0 [B, H, Dk, Dv]. Returns o, delta [B, N, H, Dv] and G [B, N, H], fp32.
    block_dv: value columns per program (a power of two >= 16)."""
    b, n, hk, dk = q.shape
    h, dv = v.shape[2], v.shape[3]
    # every argument's shape, as the WY kernels' callers check (the kernel reads wrong shapes out of bounds)
    reference.check_args(q, k, v, g, beta, jax.ShapeDtypeStruct((b, n, n), jnp.bool_), s0)
    if not supports(n):
        raise ValueError(f"chain_delta_rule (recurrent): chains of 1..{MAX_N} nodes, got {n}")
    rep = h // hk
    f32 = jnp.float32
    n_pad, dkp, dvp = _pow2_at_least_16(n), _pow2_at_least_16(dk), _pow2_at_least_16(dv)
    block_dv = min(_pow2_at_least_16(block_dv), dvp)

    def pad(x, widths):
        x = x.astype(f32)
        return jnp.pad(x, widths) if any(w for _, w in widths) else x

    q, k = (pad(x, [(0, 0), (0, n_pad - n), (0, 0), (0, dkp - dk)]) for x in (q, k))
    v = pad(v, [(0, 0), (0, n_pad - n), (0, 0), (0, dvp - dv)])
    g, beta = (pad(x, [(0, 0), (0, n_pad - n), (0, 0)]) for x in (g, beta))
    s0 = pad(s0, [(0, 0), (0, 0), (0, dkp - dk), (0, dvp - dv)])
    key_rows = pl.BlockSpec((None, n_pad, None, dkp), lambda bi, hi, vi: (bi, 0, hi // rep, 0))
    columns = pl.BlockSpec((None, n_pad, None, block_dv), lambda bi, hi, vi: (bi, 0, hi, vi))
    nodes = pl.BlockSpec((None, n_pad, None), lambda bi, hi, vi: (bi, 0, hi))
    state = pl.BlockSpec((None, None, dkp, block_dv), lambda bi, hi, vi: (bi, hi, 0, vi))
    out = jax.ShapeDtypeStruct((b, n_pad, h, dvp), f32)
    o, delta = pl.pallas_call(
        functools.partial(_recurrent_kernel, n=n),
        out_shape=(out, out),
        grid=(b, h, dvp // block_dv),
        in_specs=[key_rows, key_rows, columns, nodes, nodes, state],
        out_specs=[columns, columns],
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="tree_delta_rule_recurrent",
    )(q, k, v, g, beta, s0)
    return o[:, :n, :, :dv], delta[:, :n, :, :dv], jnp.cumsum(g[:, :n], axis=1)
