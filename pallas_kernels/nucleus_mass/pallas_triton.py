"""The mass of a row above each of its thresholds in one read of the row: a Pallas kernel, Triton lowering.

Grid (row, vocabulary split), as the verify kernel's. A program walks its slice of one row in tiles of
`block_v`: it reads the tile's keys and masses once and adds each entry's mass where it is above each of the row's
W thresholds (a [W, block_v] compare) to a [W, block_v] running sum, summed across once at the end; XLA sums the splits'
partials. XLA's form of the same sum (reference.mass_above, a [R, W, V] reduction) re-reads the row per
threshold; on an H100 a 16-way search pass over 64 rows of 248,320 took ~0.12 ms, ~3x reading the rows
(bench/results/2026-12-05-h100-s55/nucleus/). Tiles that would cross the row's end are shifted back and the
repeated columns masked, as in the verify kernel.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.verify.pallas_triton import default_splits


def _kernel(key_ref, e_ref, t_ref, out_ref, *, vocab, splits, block_v):
    split = pl.program_id(1)
    chunk = pl.cdiv(pl.cdiv(vocab, splits), block_v) * block_v
    lo = split * chunk
    hi = jnp.minimum(lo + chunk, vocab)
    cols = lax.broadcasted_iota(jnp.int32, (block_v,), 0)
    t = t_ref[...]

    def body(i, acc):
        p0 = lo + i * block_v
        off = jnp.minimum(p0, vocab - block_v)
        pos = off + cols
        e = jnp.where((pos >= p0) & (pos < hi), e_ref[pl.ds(off, block_v)], 0.0)
        above = key_ref[pl.ds(off, block_v)][None, :] > t[:, None]              # [W, block_v]
        return acc + jnp.where(above, e[None, :], 0.0)          # summed across the tile once, at the end

    n_tiles = pl.cdiv(jnp.maximum(hi - lo, 0), block_v)
    acc = lax.fori_loop(0, n_tiles, body, jnp.zeros((t.shape[0], block_v), jnp.float32))
    out_ref[...] = jnp.sum(acc, axis=1)


@functools.partial(jax.jit, static_argnames=("interpret", "block_v", "splits", "num_warps"))
def mass_above(key, e, t, *, interpret=False, block_v=512, splits=None, num_warps=4):
    """reference.mass_above's contract for [R, V] rows; W (t's width) must be a power of two (api.mass_above pads
    it)."""
    r, v = key.shape
    w = t.shape[1]
    block_v = min(block_v, 1 << (v.bit_length() - 1))
    splits = splits or default_splits(r, v, block_v)
    part = jax.ShapeDtypeStruct((r, splits, w), jnp.float32)
    out = pl.pallas_call(
        functools.partial(_kernel, vocab=v, splits=splits, block_v=block_v),
        out_shape=part,
        grid=(r, splits),
        in_specs=[pl.BlockSpec((None, v), lambda ri, si: (ri, 0)), pl.BlockSpec((None, v), lambda ri, si: (ri, 0)),
                  pl.BlockSpec((None, w), lambda ri, si: (ri, 0))],
        out_specs=pl.BlockSpec((None, None, w), lambda ri, si: (ri, si, 0)),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="nucleus_mass",
    )(key, e, t)
    return out.sum(1)
