"""Residual add + RMSNorm in the deferred form (reference.add_rms_norm) as one Pallas kernel (Triton lowering):
a program per row reads x, u and w once and writes x + u, h = (x + u) * (offset + w) and the row scale r, where
XLA runs two kernels a norm (the add; the sum of squares with h). Same contract as reference.add_rms_norm.

The row is walked in chunks of the largest power of two (at most 1024) dividing D: Triton's loads want
power-of-two shapes, and 5120 = 5 x 1024. Every load comes first, so that all of a row's loads are in flight at
once, and h does not wait for the sum of squares: only r does.

Until session 78 the kernel wrote the normalised row h * r instead. On an H100 (verify(16) at 1K,
bench/results/2026-12-07-h100-s78/) it took 5.6 us a call against the default's 2.1 + 1.9, and XLA added a
reduction after each product it fed, which the deferred row scale avoids.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton


MAX_CHUNKS = 64     # the walk is unrolled: D = 5121 would be 5121 one-element chunks, slow to lower


def chunk_of(d: int) -> int:
    return min(d & -d, 1024)


def supports(d: int) -> bool:
    """Whether a row of width d is walked in at most MAX_CHUNKS chunks (the api runs the reference otherwise)."""
    return d // chunk_of(d) <= MAX_CHUNKS


def _kernel(x_ref, u_ref, w_ref, s_ref, h_ref, r_ref, *, d, chunk, eps, offset):
    f32 = jnp.float32
    chunks = [pl.ds(c * chunk, chunk) for c in range(d // chunk)]
    loaded = [(x_ref[cs], u_ref[cs], w_ref[cs]) for cs in chunks]
    ss = jnp.zeros((), f32)
    for cs, (x, u, w) in zip(chunks, loaded):
        s = (x.astype(f32) + u.astype(f32)).astype(s_ref.dtype)
        s_ref[cs] = s
        sf = s.astype(f32)
        h_ref[cs] = (sf * (offset + w.astype(f32))).astype(h_ref.dtype)
        ss = ss + jnp.sum(sf * sf)
    r_ref[...] = jnp.full((1,), lax.rsqrt(ss / d + eps), f32)


@functools.partial(jax.jit, static_argnames=("eps", "offset", "interpret", "num_warps"))
def add_rms_norm(x, u, w, *, eps: float, offset: float, interpret=False, num_warps=4):
    """Same contract as reference.add_rms_norm."""
    shape, d = x.shape, x.shape[-1]
    rows = x.reshape(-1, d)
    row = pl.BlockSpec((None, d), lambda i: (i, 0))
    s, h, r = pl.pallas_call(
        functools.partial(_kernel, d=d, chunk=chunk_of(d), eps=eps, offset=offset),
        out_shape=(jax.ShapeDtypeStruct(rows.shape, x.dtype), jax.ShapeDtypeStruct(rows.shape, x.dtype),
                   jax.ShapeDtypeStruct((rows.shape[0], 1), jnp.float32)),
        grid=(rows.shape[0],),
        in_specs=[row, row, pl.BlockSpec((d,), lambda i: (0,))],
        out_specs=[row, row, pl.BlockSpec((None, 1), lambda i: (i, 0))],
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="add_rms_norm",
    )(rows, u.reshape(-1, d), w)
    return s.reshape(shape), h.reshape(shape), r.reshape(shape[:-1] + (1,))
