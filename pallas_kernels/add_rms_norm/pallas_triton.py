"""Residual add + RMSNorm in the deferred form (reference.add_rms_norm) as one Pallas kernel (Triton lowering),
where XLA runs two kernels a norm: the add, which also sums the K slices XLA splits a skinny product into, and
the sum of squares with h.

It takes the update as the product's K slices (u [S, ..., D], jaxspec.model.Linear with `slices`; a plain
update is one slice), so that nothing has to sum them before the call. A program per row and chunk of
columns (at most 512, a power of two dividing D: Triton's blocks want power-of-two shapes) reads x, the
slices and w there once and writes x + u, h = (x + u) * (offset + w) and its chunk's sum of squares; the row
scale r = 1 / sqrt(sum / D + eps) is taken from those sums by the jnp after the call, which XLA fuses into the
product that uses r. 16 rows of 5120 are 160 programs, where a program per row made 16.

History: session 9's form (the normalised row out) made the AR round longer on the H200, and on an H100 in
session 78 it added 0.26-0.52 ms of kernels to verify(16), verify(64) and the AR step at 1K
(bench/results/2026-12-07-h100-s78/): 5.6 us a call (a program per row) against the default's 2.1 + 1.9, a
reduction XLA added after each product it fed, and, ahead of the call, a sum of the K slices of each product
feeding it (127 a step, 0.242 ms). Session 78's second form (deferred, a program per row, a plain update) was
never run on a GPU; session 79 replaced it with this one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton


MAX_CHUNKS = 64     # a row in more chunks than this runs the reference (D = 5121 would be 5121 programs a row)
MAX_CHUNK = 512


def chunk_of(d: int) -> int:
    return min(d & -d, MAX_CHUNK)


def supports(d: int, slices: int = 1) -> bool:
    """Whether the kernel takes rows of width d (in at most MAX_CHUNKS chunks) and `slices` slices of the update
    (a power of two: a Triton block dimension). The api runs the reference otherwise."""
    return d > 0 and d // chunk_of(d) <= MAX_CHUNKS and slices > 0 and slices & (slices - 1) == 0


def _kernel(x_ref, u_ref, w_ref, s_ref, h_ref, q_ref, *, offset):
    f32 = jnp.float32
    s = (x_ref[...].astype(f32) + jnp.sum(u_ref[...].astype(f32), 0)).astype(s_ref.dtype)
    s_ref[...] = s
    sf = s.astype(f32)
    h_ref[...] = (sf * (offset + w_ref[...].astype(f32))).astype(h_ref.dtype)
    q_ref[...] = jnp.full((1,), jnp.sum(sf * sf), f32)


@functools.partial(jax.jit, static_argnames=("eps", "offset", "interpret", "num_warps"))
def add_rms_norm(x, u, w, *, eps: float, offset: float, interpret=False, num_warps=4):
    """Same contract as reference.add_rms_norm (u the update [..., D] or its slices [S, ..., D])."""
    shape, d = x.shape, x.shape[-1]
    rows = x.reshape(-1, d)
    parts = (u[None] if u.ndim == x.ndim else u).reshape(-1, rows.shape[0], d)
    chunk = chunk_of(d)
    row = pl.BlockSpec((None, chunk), lambda i, c: (i, c))
    s, h, q = pl.pallas_call(
        functools.partial(_kernel, offset=offset),
        out_shape=(jax.ShapeDtypeStruct(rows.shape, x.dtype), jax.ShapeDtypeStruct(rows.shape, x.dtype),
                   jax.ShapeDtypeStruct((rows.shape[0], d // chunk), jnp.float32)),
        grid=(rows.shape[0], d // chunk),
        in_specs=[row, pl.BlockSpec((parts.shape[0], None, chunk), lambda i, c: (0, i, c)),
                  pl.BlockSpec((chunk,), lambda i, c: (c,))],
        out_specs=[row, row, pl.BlockSpec((None, 1), lambda i, c: (i, c))],
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="add_rms_norm",
    )(rows, parts, w)
    r = lax.rsqrt(jnp.sum(q, -1, keepdims=True) / d + eps)
    return s.reshape(shape), h.reshape(shape), r.reshape(shape[:-1] + (1,))
