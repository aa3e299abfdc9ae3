"""Tree attention as a flash-decoding Pallas kernel with the Triton lowering.

Rows. The G = H / KV query heads of one kv head and the N nodes form R = N * G query rows (row
r = node * G + head), cut into blocks of `block_q` rows: every row of a block reads the same keys,
so one K/V tile feeds a [block_q, block_k] score tile (Triton's `dot` wants all sides >= 16).

Grid (batch, kv head, split, row block). Splits 0 .. S-1 share the committed prefix [0, start) of
their sequence evenly (chunks of a whole number of `block_k` keys, computed from `start` inside the
kernel, so a short prefix reads only its own keys and a long one spreads over all S programs); the
last split, S, takes the tree block, slots start .. start+N-1, the only place where the ancestor mask applies;
a row block reads the tree's key tiles only up to the last node any of its rows sees (`tree_columns`: in a
topological order a chain's blocks skip the tiles past their own nodes, half of an 8K prefill's). Each program
keeps an online softmax (running max m, sum l, accumulator acc, all fp32) over its keys and writes them out;
`_combine` merges the S + 1 partials per row (a small jnp step). Reads stop at the tile holding slot
start + N - 1, whatever the cache length L; slots of a tile outside its program's range are masked and their values
zeroed, so stale cache rows (even NaN) never count.

Loads never leave the cache: a key tile that would cross L is shifted back to end at L, and the keys it
then repeats are masked off (a dynamic slice past the end would be clamped in interpret mode and read
out of bounds on the GPU). The ancestor mask is expanded to rows ([R, N] int8) and padded by one tile
on the left for the same shift.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

NUM_SMS = 132        # H200; the split count aims at a few programs per SM
MAX_HEAD_DIM = 512   # at 1024 even the smallest default key tile (16) overflows shared memory (`tiles`)


def supports(q_shape, keys_shape) -> bool:
    """Whether the kernel takes these shapes (the api falls back to the reference otherwise)."""
    hd, length = q_shape[-1], keys_shape[1]
    return 16 <= hd <= MAX_HEAD_DIM and hd & (hd - 1) == 0 and length >= 16


def _online_update(carry, s, mask, v, key_ok, precision):
    """One key tile into (m, l, acc): s [bq, bk] fp32 scores, mask [bq, bk], v [bk, hd]; key_ok [bk]
    the keys of the tile's range (the value rows of the others are zeroed: 0 * NaN is NaN)."""
    m, l, acc = carry
    s = jnp.where(mask & key_ok[None, :], s, -jnp.inf)
    v = jnp.where(key_ok[:, None], v, jnp.zeros_like(v))
    m_new = jnp.maximum(m, jnp.max(s, axis=1))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)        # a row with nothing visible yet
    p = jnp.exp(s - m_safe[:, None])
    alpha = jnp.exp(m - m_safe)
    pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=precision,
                         preferred_element_type=jnp.float32)
    return m_new, l * alpha + jnp.sum(p, axis=1), acc * alpha[:, None] + pv


def _kernel(start_ref, q_ref, k_ref, v_ref, *refs, splits, block_k, length, precision, tree_block):
    """With `tree_block` the refs are (cols, anc, m, l, acc) and program `splits` takes the tree block; without, they
    are (m, l, acc) and every program takes a share of the prefix (`prefix_partials`)."""
    cols_ref, anc_ref, m_ref, l_ref, acc_ref = refs if tree_block else (None, None) + refs
    split = pl.program_id(2)
    start = start_ref[()]
    bq, hd = q_ref.shape
    q = q_ref[...]
    scale = 1.0 / math.sqrt(hd)
    cols = lax.broadcasted_iota(jnp.int32, (block_k,), 0)

    def scores(off):
        k = k_ref[pl.ds(off, block_k), :]
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                            preferred_element_type=jnp.float32)
        return s * scale, v_ref[pl.ds(off, block_k), :]

    def tile(p0):
        """The tile of keys p0 .. p0+block_k-1, shifted back to end at L if it would cross it."""
        off = jnp.minimum(p0, length - block_k)
        return off, off + cols           # load offset, key position of each column

    init = (jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32),
            jnp.zeros((bq, hd), jnp.float32))

    def prefix():
        chunk = pl.cdiv(pl.cdiv(start, splits), block_k) * block_k
        lo = split * chunk
        hi = jnp.minimum(lo + chunk, start)

        def body(i, carry):
            p0 = lo + i * block_k
            off, pos = tile(p0)
            s, v = scores(off)
            return _online_update(carry, s, True, v, (pos >= p0) & (pos < hi), precision)

        return lax.fori_loop(0, pl.cdiv(jnp.maximum(hi - lo, 0), block_k), body, init)

    def tree():
        def body(j, carry):
            p0 = start + j * block_k
            off, pos = tile(p0)
            s, v = scores(off)
            # anc_ref column c + block_k holds tree node c (one tile of left padding)
            anc = anc_ref[:, pl.ds(off - start + block_k, block_k)]
            return _online_update(carry, s, anc != 0, v, (pos >= p0) & (pos < start + cols_ref[()]), precision)

        return lax.fori_loop(0, pl.cdiv(cols_ref[()], block_k), body, init)

    m, l, acc = lax.cond(split < splits, prefix, tree) if tree_block else prefix()
    m_ref[...] = m
    l_ref[...] = l
    acc_ref[...] = acc


def _combine(m, l, acc):
    """Merge the partials over the split axis (2): m, l [B, KV, S+1, R], acc [B, KV, S+1, R, hd]."""
    mx = jnp.max(m, axis=2, keepdims=True)
    w = jnp.exp(m - jnp.where(mx == -jnp.inf, 0.0, mx))
    den = jnp.sum(w * l, axis=2)
    return jnp.sum(w[..., None] * acc, axis=2) / jnp.where(den == 0, 1.0, den)[..., None]


def tree_columns(anc, group: int, block_q: int):
    """[B, row blocks] int32: for each block of `block_q` query rows (row = node * group + head), one past the last
    tree node any of its rows sees (0 for a block of padding rows alone). The kernel reads no tree key past it: the
    keys it skips are masked for every row of the block, so the result is the same for any mask."""
    b, n, _ = anc.shape
    node = jnp.max(jnp.where(anc, jnp.arange(1, n + 1, dtype=jnp.int32), 0), axis=2)          # [B, N]
    rows = jnp.repeat(node, group, axis=1)
    blocks = pl.cdiv(n * group, block_q)
    rows = jnp.pad(rows, [(0, 0), (0, blocks * block_q - n * group)])
    return jnp.max(rows.reshape(b, blocks, block_q), axis=2)


def default_splits(batch, kv_heads, row_blocks, length, block_k):
    """About two programs per SM over the prefix, at most 64 splits, none shorter than a tile."""
    want = max(1, 2 * NUM_SMS // (batch * kv_heads * row_blocks))
    return int(max(1, min(want, 64, length // block_k)))


# Shared memory one block may take on an H200 (Triton reports requests against this number).
SMEM_LIMIT = 232448


def smem_bytes(block_q, block_k, hd, itemsize, num_stages):
    """Upper estimate of a program's shared memory: the K tile per pipeline stage plus V, the query block,
    and the fp32 score and probability tiles. On the H200 it matched Triton's requests: 294,912 bytes
    for bf16 (64, 128, hd 256, 2 stages) exactly, and 245,760 against 237,824 for fp32 (32, 64, hd 256)."""
    return ((num_stages + 1) * block_k * hd * itemsize + block_q * hd * itemsize + 2 * block_q * block_k * 4)


def tiles(rows, hd, itemsize, num_stages=2, block_q=None, block_k=None, num_warps=None, check=True):
    """(block_q, block_k, num_warps): the given ones, else the defaults for `rows` query rows of head_dim `hd`.
    block_q: up to 64 rows for 16-bit caches, 32 for fp32 (fp32 tiles take twice the registers, and fp32 dots
    run as FMA, not on tensor cores). block_k: the largest tile up to 64 keys whose pipeline fits in shared
    memory (fp32 at hd 256: 32), but 32 with a query block of 64 x 256 or more. num_warps: 8 above a
    64 x 256 query block, else 4. On the H200 at a 128K prefix, N = 65, bf16 (per layer): 64 x 32 on 4 warps
    946 us, 64 x 64 on 8 warps (the earlier default) 1602, on 4 warps 1364; 128 x 64 on 8 warps 1055, on 4
    2952 (bench/results/2026-11-30-h200-s11-rounds/k3_ta.log). check: refuse an explicit tile that cannot fit."""
    block_q = block_q or min(64 if itemsize == 2 else 32, max(16, pl.next_power_of_2(rows)))
    big_q = block_q * hd >= 64 * 256
    if block_k is None:
        block_k = 32 if big_q else 64
        while block_k > 16 and smem_bytes(block_q, block_k, hd, itemsize, num_stages) > SMEM_LIMIT:
            block_k //= 2
    elif check and smem_bytes(block_q, block_k, hd, itemsize, num_stages) > SMEM_LIMIT:
        raise ValueError(f"tree_attention kernel: block_q={block_q}, block_k={block_k}, num_stages={num_stages} at "
                         f"head_dim {hd} ({itemsize}-byte cache) needs about "
                         f"{smem_bytes(block_q, block_k, hd, itemsize, num_stages)} bytes of shared memory, "
                         f"more than the {SMEM_LIMIT} a block may have; use a smaller block_k or block_q")
    num_warps = num_warps or (8 if block_q * hd > 64 * 256 else 4)
    return block_q, block_k, num_warps


def _rows(x, group):
    """[B, N, KV * G, ...] -> [B, KV, N * G, ...]: row r = node * G + head of the kv head's group."""
    b, n, h = x.shape[:3]
    kvh = h // group
    x = x.reshape((b, n, kvh, group) + x.shape[3:])
    return jnp.moveaxis(x, 2, 1).reshape((b, kvh, n * group) + x.shape[4:])


def _unrows(x, n, group):
    """The inverse of `_rows` for [B, KV, R, ...] with R >= N * G rows (padding rows dropped)."""
    b, kvh = x.shape[:2]
    x = x[:, :, :n * group].reshape((b, kvh, n, group) + x.shape[3:])
    return jnp.moveaxis(x, 1, 2).reshape((b, n, kvh * group) + x.shape[4:])


def _partials(q, keys, values, start, anc, *, interpret, block_q, block_k, splits, num_warps, num_stages):
    """The kernel's per-program online-softmax partials (m, l [B, KV, S', R], acc [B, KV, S', R, hd], fp32; R the
    padded rows) and the group size. With `anc` ([B, N, N]) the last of S' = S + 1 programs takes the tree block;
    with anc None the S' = S programs share the prefix alone (`prefix_partials`)."""
    b, n, h, hd = q.shape
    length, kvh = keys.shape[1], keys.shape[2]
    if not supports(q.shape, keys.shape):
        raise ValueError(f"tree_attention kernel: head_dim {hd} must be a power of two >= 16 and the "
                         f"cache length {length} >= 16")
    group = h // kvh
    rows = n * group
    block_q, block_k, num_warps = tiles(rows, hd, keys.dtype.itemsize, num_stages, block_q, block_k, num_warps,
                                        check=not interpret)
    block_k = min(block_k, 1 << (length.bit_length() - 1))      # a tile fits in the cache
    row_blocks = pl.cdiv(rows, block_q)
    r_pad = row_blocks * block_q
    splits = splits or default_splits(b, kvh, row_blocks, length, block_k)
    tree_block = anc is not None
    qr = jnp.pad(_rows(q, group), [(0, 0), (0, 0), (0, r_pad - rows), (0, 0)]).astype(keys.dtype)   # [B, KV, R, hd]
    f32 = jnp.float32
    precision = lax.Precision.HIGHEST if (interpret or keys.dtype == f32) else lax.Precision.DEFAULT
    cache = pl.BlockSpec((None, length, None, hd), lambda bi, ki, si, ri: (bi, 0, ki, 0))
    per_row = lambda *blk: pl.BlockSpec((None, None, None, block_q) + blk,
                                        lambda bi, ki, si, ri: (bi, ki, si, ri) + (0,) * len(blk))
    in_specs = [pl.BlockSpec((None,), lambda bi, ki, si, ri: (bi,)),
                pl.BlockSpec((None, None, block_q, hd), lambda bi, ki, si, ri: (bi, ki, ri, 0)), cache, cache]
    args = [start.astype(jnp.int32), qr, keys, values]
    if tree_block:
        n_tiles = pl.cdiv(n, block_k)
        anc_rows = jnp.repeat(anc.astype(jnp.int8), group, axis=1)                         # [B, R, N]
        anc_rows = jnp.pad(anc_rows, [(0, 0), (0, r_pad - rows), (block_k, n_tiles * block_k - n)])
        in_specs += [pl.BlockSpec((None, None), lambda bi, ki, si, ri: (bi, ri)),
                     pl.BlockSpec((None, block_q, anc_rows.shape[2]), lambda bi, ki, si, ri: (bi, ri, 0))]
        args += [tree_columns(anc, group, block_q), anc_rows]
    programs = splits + tree_block
    m, l, acc = pl.pallas_call(
        functools.partial(_kernel, splits=splits, block_k=block_k, length=length, precision=precision,
                          tree_block=tree_block),
        out_shape=(jax.ShapeDtypeStruct((b, kvh, programs, r_pad), f32),
                   jax.ShapeDtypeStruct((b, kvh, programs, r_pad), f32),
                   jax.ShapeDtypeStruct((b, kvh, programs, r_pad, hd), f32)),
        grid=(b, kvh, programs, row_blocks),
        in_specs=in_specs,
        out_specs=[per_row(), per_row(), per_row(hd)],
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="tree_attention",
    )(*args)
    return m, l, acc, group


@functools.partial(jax.jit, static_argnames=("interpret", "block_q", "block_k", "splits", "num_warps",
                                             "num_stages"))
def tree_attention(q, keys, values, start, anc, *, interpret=False, block_q=None, block_k=None, splits=None,
                   num_warps=None, num_stages=2):
    """Same contract as reference.tree_attention. block_q: query rows per program (a power of two
    >= 16; default up to 64 for 16-bit caches, 32 for fp32); block_k: keys per tile; splits: programs sharing the
    prefix (default `default_splits`)."""
    m, l, acc, group = _partials(q, keys, values, start, anc, interpret=interpret, block_q=block_q, block_k=block_k,
                                 splits=splits, num_warps=num_warps, num_stages=num_stages)
    return _unrows(_combine(m, l, acc), q.shape[1], group).astype(values.dtype)


def prefix_partials(q, keys, values, start, *, interpret=False, block_q=None, block_k=None, splits=None,
                    num_warps=None, num_stages=2):
    """The online-softmax partials of N query nodes (q [B, N, H, hd]) over the committed prefix alone (slots
    0 .. start-1; nothing of the tree block): m, l [B, N, H, S] and acc [B, N, H, S, hd], fp32, one entry per
    prefix split, for a caller that attends to the block itself some other way (pallas_kernels/chain_attention)
    and merges the two. Tiles, splits and warps as `tree_attention`'s."""
    m, l, acc, group = _partials(q, keys, values, start, None, interpret=interpret, block_q=block_q, block_k=block_k,
                                 splits=splits, num_warps=num_warps, num_stages=num_stages)
    n = q.shape[1]
    m, l = (_unrows(jnp.moveaxis(x, 2, -1), n, group) for x in (m, l))
    return m, l, _unrows(jnp.moveaxis(acc, 2, -2), n, group)
