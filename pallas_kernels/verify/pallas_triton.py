"""The target's choice per node in one pass over the logits: a Pallas kernel, Triton lowering.

Grid (row, vocab split). A program walks its slice of one row's vocabulary in tiles of `block_v`,
keeps the best (value, index) so far (strictly greater wins, so the lowest index wins ties: tiles go
in increasing order) and writes it out; `combine` takes the best split per row, again the first on
ties. At temperature T the value is logits / T + Gumbel noise made in the kernel from a hash of
(seed, row, column) (reference.gumbel: the same integer and float operations), so the noise never
touches memory. `gumbel_partial` takes the global (row, column) of the slice's first element, so that a
shard of the vocabulary (jaxspec/sharding.py `vocab_choice`) hashes and reports global positions and the
shards' bests combine into the unsharded choice. Tiles that would cross the vocabulary end are shifted
back and the repeated columns masked, as in tree attention.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.verify import reference

NUM_SMS = 132
NONE = np.int32(2 ** 31 - 1)        # index of "nothing seen yet"


def _kernel(seed_ref, origin_ref, x_ref, val_ref, idx_ref, *, vocab, splits, block_v, inv_t):
    row, split = pl.program_id(0), pl.program_id(1)
    row0, col0 = origin_ref[0], origin_ref[1]
    chunk = pl.cdiv(pl.cdiv(vocab, splits), block_v) * block_v
    lo = split * chunk
    hi = jnp.minimum(lo + chunk, vocab)
    cols = lax.broadcasted_iota(jnp.int32, (block_v,), 0)
    seed = (seed_ref[0], seed_ref[1]) if inv_t else None

    def body(i, best):
        p0 = lo + i * block_v
        off = jnp.minimum(p0, vocab - block_v)
        pos = off + cols
        x = x_ref[pl.ds(off, block_v)].astype(jnp.float32)
        if inv_t:
            x = x * np.float32(inv_t) + reference.gumbel(seed, (row + row0).astype(jnp.uint32),
                                                         (pos + col0).astype(jnp.uint32))
        ok = (pos >= p0) & (pos < hi)
        x = jnp.where(ok, x, -jnp.inf)
        m = jnp.max(x)
        idx = jnp.min(jnp.where(ok & (x == m), pos, NONE))
        better = (m > best[0]) | (best[1] == NONE)
        return jnp.where(better, m, best[0]), jnp.where(better, idx, best[1])

    n_tiles = pl.cdiv(jnp.maximum(hi - lo, 0), block_v)
    val, idx = lax.fori_loop(0, n_tiles, body, (jnp.float32(-jnp.inf), NONE))
    val_ref[...] = jnp.full((1,), val, jnp.float32)
    idx_ref[...] = jnp.full((1,), jnp.where(idx == NONE, NONE, idx + col0), jnp.int32)


def combine(val, idx):
    """[R, S] partials (S splits or shards, in column order) -> ([R] best value, [R] its index): the first
    on ties; a row with nothing finite gives (-inf, the first index seen, or NONE if none)."""
    seen = idx != NONE
    best = jnp.argmax(jnp.where(seen, val, -jnp.inf), axis=1)
    pick = lambda a: jnp.take_along_axis(a, best[:, None], 1)[:, 0]
    return pick(val), pick(idx)


TILES_PER_PROGRAM = 4


def default_splits(rows, vocab, block_v):
    """Programs per row: enough to fill the SMs twice over, and enough that no program walks more than
    TILES_PER_PROGRAM tiles in a row. On the H200 at V = 248320 (bench/results/2026-12-01-h200-s17-verify),
    32 splits of ~4 tiles read 64 rows in 22.7 us against 35.6 for 4 splits of ~30 tiles."""
    by_sms = -(-2 * NUM_SMS // rows)
    by_tiles = -(-vocab // (TILES_PER_PROGRAM * block_v))
    return int(max(1, min(max(by_sms, by_tiles), 64, vocab // block_v)))


@functools.partial(jax.jit, static_argnames=("temperature", "interpret", "block_v", "splits", "num_warps"))
def gumbel_partial(seed, logits, temperature: float, row0=0, col0=0, *, interpret=False, block_v=2048,
                   splits=None, num_warps=4):
    """logits [R, V] holding global rows row0.. and columns col0.. -> ([R] f32 best value, [R] int32 its
    global column, NONE for a row with no column): reference.gumbel_partial's contract."""
    r, v = logits.shape
    block_v = min(block_v, 1 << (v.bit_length() - 1))
    splits = splits or default_splits(r, v, block_v)
    inv_t = 0.0 if temperature == 0.0 else 1.0 / temperature
    part = pl.BlockSpec((None, None, 1), lambda ri, si: (ri, si, 0))
    origin = jnp.stack([jnp.asarray(row0, jnp.int32), jnp.asarray(col0, jnp.int32)])
    val, idx = pl.pallas_call(
        functools.partial(_kernel, vocab=v, splits=splits, block_v=block_v, inv_t=inv_t),
        out_shape=(jax.ShapeDtypeStruct((r, splits, 1), jnp.float32), jax.ShapeDtypeStruct((r, splits, 1), jnp.int32)),
        grid=(r, splits),
        in_specs=[pl.BlockSpec((2,), lambda ri, si: (0,)), pl.BlockSpec((2,), lambda ri, si: (0,)),
                  pl.BlockSpec((None, v), lambda ri, si: (ri, 0))],
        out_specs=[part, part],
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="verify_choice",
    )(seed.astype(jnp.uint32), origin, logits)
    return combine(val[..., 0], idx[..., 0])


def gumbel_choice(seed, logits, temperature: float, *, interpret=False, block_v=2048, splits=None, num_warps=4):
    """Same contract as reference.gumbel_choice: logits [R, V], seed [2] uint32 -> [R] int32."""
    _, idx = gumbel_partial(seed, logits, temperature, interpret=interpret, block_v=block_v, splits=splits,
                            num_warps=num_warps)
    return jnp.where(idx == NONE, 0, idx)
