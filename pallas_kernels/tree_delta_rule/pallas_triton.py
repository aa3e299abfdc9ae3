"""The tree delta rule as Pallas kernels with the Triton lowering.

The block of N nodes is cut into tiles of T = 16 nodes (the smallest tile Triton's `dot` takes). The
ancestor mask is lower-triangular (parents come before children), so every N x N matrix below is
block lower-triangular and tile i needs only tiles j <= i. With E = diag(e^G), B = diag(beta),
A = B (strict(D) * K K^T) and P = D * Q K^T, reference.py's

    Delta = (I + A)^-1 B (V - E K S0)        O = E Q S0 + P Delta

is regrouped, as in the chunked (WY/UT) form of the delta rule, into

    Tb = (I + A)^-1 B      M = P Tb      Delta = Tb V - (Tb E K) S0      O = (E Q - M E K) S0 + M V

* The Gram matrices K K^T and Q K^T per key head: for blocks of more than one tile, batched XLA products
  ahead of the kernels. In the kernel they cost a serial chain of K and Q loads and
  FMA dots: at the real shape and N = 65 the prepare kernel took 101 us a layer that way (4.87 ms of a
  25.6 ms verify(65), bench/results/2026-11-30-h200-verify-profile). For a block of one tile (a DFlash
  block of 16) they are one small dot each inside `_prepare_kernel`, which saves the products' launches.
  A kernel of their own (a program per batch row, key head and tile of rows) was slower on the H200 than
  XLA's dot with its slice and transpose (28.9 / 32.4 against 27.5 / 29.9 us a layer for the whole rule at
  N = 64 / 65, bench/results/2026-12-04-h200-s44/tdr-gram/), and was removed. XLA already merged the two into
  one product, [Q; K] K^T, then sliced its output in two (1.4 us a layer at N = 64 in session 46's round); the
  product is now written that way and both kernels read their half of it through their index maps. In fp32
  (`gram_precision="ieee"`) XLA ran it as 8.5 us of FMA tiles. It is formed in three tf32 tensor-core passes
  ("tf32x3", the default since session 50; the op's outputs differ from the fp32 product's by 2-4e-7, relative): on the
  H200 the op went from 47.6 / 57.5 to 46.2 / 57.3 us a layer at N = 64 / 65
  (bench/results/2026-12-05-h200-s49/call1-tdr-ops/), and the DDTree(63) round at 1K from 20.88 to 20.32 ms,
  the DFlash round unchanged (17.39 / 17.38; one run each in one lease, where identical code spread over
  0.39 ms in DDTree(63): bench/results/2026-12-05-h200-s50/). Repeated alternately in session 52: 20.67 against
  20.75 ms in the mean of two runs each, inside the spread, and its GPU tests pass
  (bench/results/2026-12-05-h200-s52/).
* `_prepare_kernel` (a program per batch row and value head) does the rest of what touches neither S0
  nor V: G = anc g, the decayed, masked tiles and the solve. Tb is built tile by tile by block forward
  substitution, the diagonal tiles' inverses by recursive doubling of their diagonal blocks (six [T, T] dots
  a tile; until session 46 a forward substitution over the tile's rows, 15 steps of two cross-thread
  reductions: the op at N = 16 / 64 / 65 went 21.8 / 62.3 / 73.0 -> 19.2 / 51.1 / 60.6 us a layer,
  bench/results/2026-12-04-h200-s46/). Neither is a power series: (I + A)^-1 = prod_m (I + A^(2^m)) loses
  everything to cancellation when keys are correlated and decays weak (relative error 4e8 at N = 64,
  measured against float64).
* `_apply_kernel` (a program per batch row, value head, slice of the value dim and node tile) forms
  Tb E K and M E K for its tile a key chunk at a time, multiplies them into S0, and adds Tb V and M V.
  Tiles do not depend on each other, so the work spreads over the SMs. Reading Tb's and M's rows whole
  (one dot over all N nodes instead of a loop over tiles) was slower on the H200: 57.0 / 79.0 us a layer
  for the op at N = 64 / 65 against 51.1 / 60.6, and with the key chunks unrolled too 107.6 / 595.6
  (session 46).
* Removed after the H200's op bench (48 dependent layers, device us a layer at N = 16 / 64 / 65 against the
  default's 19.2 / 47.6 / 57.5; bench/results/2026-12-05-h200-s49/call1-tdr-ops/): `split_m`, M = P Tb in a
  kernel of its own, a program per tile of rows (22.3 / 51.7 / 59.0; no gain in session 43 either), and
  `split_keys`, W = Tb E K and U = E Q - M E K in a kernel of their own, a program per tile of rows and key chunk
  (20.0 / 46.6 / 58.9 with chunks of 32, 20.5 / 53.0 / 67.3 with 64): at most 1 us a layer, 0.05 ms a round, where
  keeping it needed 0.15. And `one_kernel`, prepare and apply as one kernel for a block of one tile, each
  program solving its head's tile itself: 18.1 against 19.2 us a layer at N = 16 in the op bench, but the
  DFlash round at 1K was 17.38 against 17.39 ms (session 50, bench/results/2026-12-05-h200-s50/). And `tile`,
  tiles of 32 or 64 rows (fewer, larger dots in both kernels' chains): on an H100 at N = 64, 91.3 / 50.9 us a layer
  with 32-row tiles and 4 / 8 warps, 1365 / 284.5 with 64-row tiles, against the default's 46.8; at N = 65 161.8 /
  101.1 against 59.6 (session 59, bench/results/2026-12-06-h100-s59/tdr-tiles-ops/).

Every value a program computes and reads again stays in its registers; anything read across tiles
goes through the next kernel (reading back a program's own writes would need a barrier between its
threads). Everything is kept small for ptxas: with the whole block's Delta tiles alive in one
unrolled program, or the tile inverse as an scf.for with the tile as carry, ptxas 12.9 (sm_90a) fell
back to 32 registers and spilled ~100 KB per thread at N = 65; as written (with the Gram dots still
inside), `_prepare_kernel` spilled 72 bytes there (860 with tf32x3) and `_apply_kernel` nothing
(Triton 3.8 from pip; the H200 compiles with XLA's own Triton and ptxas, so measure there).

The Triton lowering wants every loaded or computed array to have a power-of-two size, hence the tiles;
the block only has to be a whole number of tiles (N = 65 runs as 80 rows, not 128). Small head dims
are zero-padded to 16, which changes nothing: padded key dims add 0 to every dot product, padded
value columns of V and S0 give zero columns of Delta and O, sliced off.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.tree_delta_rule import reference

TILE = 16       # rows per tile: Triton's dot wants M, N, K >= 16
MAX_N = 128     # _prepare_kernel unrolls (N/16)^2 / 2 tile pairs; larger trees go to the xla solver

PRECISIONS = {
    # fp32 FMA dots: the reference's own arithmetic.
    "ieee": lax.Precision.HIGHEST,
    # three tf32 tensor-core passes: about fp32 accuracy at a fraction of the FMA time.
    "tf32x3": lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
}


def supports(n: int) -> bool:
    """Whether the kernels take a block of n nodes (the api falls back to the xla solver otherwise)."""
    return 1 <= n <= MAX_N


def _dot(a, b, precision, *, trans_b=False):
    dims = (((1,), (1 if trans_b else 0,)), ((), ()))
    return lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


def _decay(g_rows, g_cols, anc):
    """exp(G_i - G_j) where j is an ancestor-or-self of i, else 0: from the difference (never
    exp(G_i) * exp(-G_j), which overflows on long paths); the inner where keeps a non-ancestor's
    difference, which may be large and positive, out of exp."""
    on = anc > 0.5
    return jnp.where(on, jnp.exp(jnp.where(on, g_rows[:, None] - g_cols[None, :], 0.0)), 0.0)


def _unit_lower_inverse(a, precision):
    """(I + a)^-1 for a strictly lower-triangular [T, T] tile, by recursive doubling of diagonal blocks
    (as xla.py, within one tile): with Y the inverse of the diagonal blocks of size s,

        [[P, 0], [Q, R]]^-1 = [[P^-1, 0], [-R^-1 Q P^-1, R^-1]]    i.e.    Y <- Y - Y C Y

    where C holds a's lower-left s x s block of every diagonal block of size 2s. Blocks of 2 are done
    elementwise, then two [T, T] dots a level (three levels at T = 16). Each level multiplies only inverses
    of diagonal blocks and entries of a, never powers of a. Padding rows of `a` are zero and stay e_r.
    This replaced a forward substitution over the tile's rows (15 steps of two cross-thread reductions
    each), the longest serial chain in `_prepare_kernel`."""
    t = a.shape[0]
    r = lax.broadcasted_iota(jnp.int32, (t, t), 0)
    c = lax.broadcasted_iota(jnp.int32, (t, t), 1)
    inv = jnp.where(r == c, 1.0, 0.0) - jnp.where((r // 2 == c // 2) & (r > c), a, 0.0)
    s = 2
    while s < t:
        low = (r // (2 * s) == c // (2 * s)) & ((r // s) % 2 == 1) & ((c // s) % 2 == 0)
        inv = inv - _dot(_dot(inv, jnp.where(low, a, 0.0), precision), inv, precision)
        s *= 2
    return inv


def _prepare_kernel(*refs, n, precision, gram_inside, write_p):
    """Per (batch row, value head): G = anc g, then Tb and M tile by tile, each tile written out as soon as it is
    known. With `gram_inside` (blocks of one tile: a DFlash block of 16) the Gram tiles K_i K_j^T and Q_i K_j^T
    are dots of this program's own Q and K rows; else they are read from the product made ahead of the kernel.
    With `write_p` (a chain's blocks) the second output is P = D * Q K^T instead of M = P Tb."""
    dot = functools.partial(_dot, precision=precision)
    if gram_inside:
        q_ref, k_ref, g_ref, beta_ref, anc_ref, tb_ref, m_ref, G_ref = refs
        kk_at = lambda ri, rj: dot(k_ref[ri, :], k_ref[rj, :], trans_b=True)
        qk_at = lambda ri, rj: dot(q_ref[ri, :], k_ref[rj, :], trans_b=True)
    else:
        kk_ref, qk_ref, g_ref, beta_ref, anc_ref, tb_ref, m_ref, G_ref = refs
        kk_at, qk_at = (lambda ri, rj: kk_ref[ri, rj]), (lambda ri, rj: qk_ref[ri, rj])
    r = lax.broadcasted_iota(jnp.int32, (TILE, TILE), 0)
    c = lax.broadcasted_iota(jnp.int32, (TILE, TILE), 1)
    rows = [pl.ds(i * TILE, TILE) for i in range(pl.cdiv(n, TILE))]
    # G = anc g (G_i sums the log-decays of i's ancestors-or-self): the mask is block lower-triangular.
    G = []
    for i, ri in enumerate(rows):
        G.append(sum(jnp.sum(anc_ref[ri, rj] * g_ref[rj][None, :], axis=1) for rj in rows[:i + 1]))
        G_ref[ri] = G[i]
    Tb = {}
    for i, ri in enumerate(rows):
        beta_i = beta_ref[ri]
        A, P = [], []
        for j, rj in enumerate(rows[:i + 1]):
            d_ij = _decay(G[i], G[j], anc_ref[ri, rj])
            kk = kk_at(ri, rj)
            A.append(beta_i[:, None] * (d_ij * (jnp.where(r > c, kk, 0.0) if j == i else kk)))
            P.append(d_ij * qk_at(ri, rj))
        # Tb_ii = (I + A_ii)^-1 B_i;  Tb_ij = -(I + A_ii)^-1 sum_{j<=l<i} A_il Tb_lj  (block substitution)
        inv_ii = _unit_lower_inverse(A[i], precision)
        for j in range(i):
            Tb[i, j] = -dot(inv_ii, sum(dot(A[l], Tb[l, j]) for l in range(j, i)))
            tb_ref[ri, rows[j]] = Tb[i, j]
        Tb[i, i] = inv_ii * beta_i[None, :]
        tb_ref[ri, ri] = Tb[i, i]
        for j in range(i + 1):
            m_ref[ri, rows[j]] = P[j] if write_p else sum(dot(P[l], Tb[l, j]) for l in range(j, i + 1))


def _row_tile(t):
    """Rows t*T .. t*T + T-1 (t a traced tile index)."""
    return pl.ds(pl.multiple_of(t * TILE, TILE), TILE)


def _apply_kernel(q_ref, k_ref, v_ref, s0_ref, G_ref, tb_ref, m_ref, o_ref, delta_ref, *, precision, key_chunk):
    """For tile i of rows (a program per batch row, value head, slice of the value dim and row tile), with Tb, M
    and G read from prepare's outputs:

        Delta_i = sum_j Tb_ij (V_j - e^G_j K_j S0),    O_i = e^G_i Q_i S0 + sum_j M_ij (V_j - e^G_j K_j S0)

    with the sums over j taken before the product with S0, so that each program multiplies S0 twice, not twice
    per tile j: a key chunk cs at a time, W_i = sum_{j<=i} Tb_ij e^G_j K_j and U_i = e^G_i Q_i - sum_{j<=i} M_ij
    e^G_j K_j ([T, key chunk] each), then Delta_i = Tb_i V - W_i S0 and O_i = U_i S0 + M_i V."""
    dot = functools.partial(_dot, precision=precision)
    i = pl.program_id(3)
    G_at = lambda t: G_ref[_row_tile(t)]
    tb_at = lambda j: tb_ref[_row_tile(i), _row_tile(j)]
    m_at = lambda j: m_ref[_row_tile(i), _row_tile(j)]

    def key_chunk_step(c, acc):
        cs = pl.ds(pl.multiple_of(c * key_chunk, key_chunk), key_chunk)

        def node_tile(j, wm):
            ek = jnp.exp(G_at(j))[:, None] * k_ref[_row_tile(j), cs]
            return wm[0] + dot(tb_at(j), ek), wm[1] + dot(m_at(j), ek)

        zero = jnp.zeros((TILE, cs.size), jnp.float32)
        w, mek = lax.fori_loop(0, i + 1, node_tile, (zero, zero))
        u = jnp.exp(G_at(i))[:, None] * q_ref[_row_tile(i), cs] - mek
        s0 = s0_ref[cs, :]
        return acc[0] - dot(w, s0), acc[1] + dot(u, s0)

    def value_step(j, acc):
        v_j = v_ref[_row_tile(j), :]
        return acc[0] + dot(tb_at(j), v_j), acc[1] + dot(m_at(j), v_j)

    zero = jnp.zeros((TILE, o_ref.shape[-1]), jnp.float32)
    acc = lax.fori_loop(0, s0_ref.shape[0] // key_chunk, key_chunk_step, (zero, zero))
    delta, o = lax.fori_loop(0, i + 1, value_step, acc)
    ri = _row_tile(i)
    delta_ref[ri, :] = delta
    o_ref[ri, :] = o


def _prepare(q, k, g, beta, anc, *, h, rep, interpret, precision, gram_inside, gram_precision, params, n,
             write_p=False):
    """`_prepare_kernel` on padded blocks (q, k [B, n_pad, Hk, Dkp]; g, beta [B, n_pad, H]; anc [B, n_pad, n_pad]
    fp32): Tb and M (P with `write_p`) [B, H, n_pad, n_pad] and G [B, n_pad, H]. n: the real nodes (the kernel
    skips padded ones)."""
    b, n_pad, _, dkp = q.shape
    f32 = jnp.float32
    # Prepare's grid: batch, value head. A key head's rows serve `rep` value heads; the node vectors of g,
    # beta and G are strided columns of [B, N, H].
    key_rows = pl.BlockSpec((None, n_pad, None, dkp), lambda bi, hi: (bi, 0, hi // rep, 0))
    # The Gram products below stack Q K^T (rows 0..n_pad) over K K^T (rows n_pad..2 n_pad) per key head.
    query_gram = pl.BlockSpec((None, None, n_pad, n_pad), lambda bi, hi: (bi, hi // rep, 0, 0))
    key_gram = pl.BlockSpec((None, None, n_pad, n_pad), lambda bi, hi: (bi, hi // rep, 1, 0))
    nodes = pl.BlockSpec((None, n_pad, None), lambda bi, hi: (bi, 0, hi))
    square = pl.BlockSpec((None, None, n_pad, n_pad), lambda bi, hi: (bi, hi, 0, 0))
    tree = pl.BlockSpec((None, n_pad, n_pad), lambda bi, hi: (bi, 0, 0))
    if gram_inside:
        gram_args, gram_specs = (q, k), [key_rows, key_rows]
    else:
        # The Gram matrices Q K^T and K K^T per key head as one batched XLA product ahead of the kernel, [Q; K] K^T
        # (fp32 out, by default from three tf32 passes), so that its serial chain of tiles loads one [T, T] tile per
        # product instead of streaming K and Q through its own FMA dots. The kernels read both halves of the one
        # array (no slices in between).
        grams = jnp.einsum("bnhk,bmhk->bhnm", jnp.concatenate([q, k], 1), k,
                           precision=lax.Precision.HIGHEST if interpret else PRECISIONS[gram_precision])
        gram_args, gram_specs = (grams, grams), [key_gram, query_gram]
    square_f32 = jax.ShapeDtypeStruct((b, h, n_pad, n_pad), f32)
    return pl.pallas_call(
        functools.partial(_prepare_kernel, n=n, precision=precision, gram_inside=gram_inside, write_p=write_p),
        out_shape=(square_f32, square_f32, jax.ShapeDtypeStruct((b, n_pad, h), f32)),
        grid=(b, h),
        in_specs=gram_specs + [nodes, nodes, tree],
        out_specs=[square, square, nodes],
        compiler_params=params,
        interpret=interpret,
        name="tree_delta_rule_prepare",
    )(*gram_args, g, beta, anc)


def _pow2_at_least_16(d):
    return max(16, pl.next_power_of_2(d))


@functools.partial(jax.jit, static_argnames=("interpret", "block_dv", "key_chunk", "num_warps", "precision",
                                             "gram_inside", "gram_precision"))
def tree_delta_rule(q, k, v, g, beta, anc, s0, *, interpret=False, block_dv=None, key_chunk=32, num_warps=4,
                    precision="ieee", gram_inside=None, gram_precision="tf32x3"):
    """Same contract as reference.tree_delta_rule (q and k at the key heads, each serving H / Hk value
    heads through the kernels' index maps, never repeated in memory); fp32 throughout.

    interpret: run the kernel bodies on the CPU (tests). block_dv: value columns per `_apply_kernel` program
    (default: 64 up to 32 nodes, else 128; the H200 sweep of 2026-11-30 timed 11.9 against 14.7 us a layer
    at N = 16, 39.8 against 30.7 at N = 65, bench/results/2026-11-30-h200-s10-xla-flags-tdr-sweep);
    key_chunk: key dims per partial dot (both powers of two >= 16, clipped to the padded head dims).
    precision: "ieee" or "tf32x3" for the compiled dots; interpret mode always computes them in exact
    fp32 (XLA:CPU has no tf32). gram_inside: the Gram tiles as dots inside `_prepare_kernel` (default: for a
    block of one tile, where that is one [16, Dk] x [Dk, 16] dot each) rather than as products ahead of it.
    gram_precision: "tf32x3" (default) or "ieee" for those products ahead of the kernels (XLA's, not the
    kernels' dots).
    """
    rep = reference.check_args(q, k, v, g, beta, anc, s0)
    b, n, h, dv = v.shape
    dk = q.shape[3]
    if not supports(n):
        raise ValueError(f"tree_delta_rule kernel takes 1..{MAX_N} nodes, got {n}")
    for name, value in (("precision", precision), ("gram_precision", gram_precision)):
        if value not in PRECISIONS:
            raise ValueError(f"tree_delta_rule: {name}={value!r}; expected one of {', '.join(PRECISIONS)}")
    f32 = jnp.float32
    q, k, v, g, beta, s0 = (x.astype(f32) for x in (q, k, v, g, beta, s0))
    nt = pl.cdiv(n, TILE)
    n_pad = nt * TILE
    gram_inside = nt == 1 if gram_inside is None else gram_inside
    dkp, dvp = _pow2_at_least_16(dk), _pow2_at_least_16(dv)
    block_dv = min(_pow2_at_least_16(block_dv or (64 if n <= 32 else 128)), dvp)
    key_chunk = min(_pow2_at_least_16(key_chunk), dkp)

    def pad(x, widths):
        return jnp.pad(x, widths) if any(w for _, w in widths) else x

    # Padded nodes: zero q, k, v, g, beta and no ancestors, so they are inert (Delta = 0, O = 0, G = 0)
    # and no real node sees them.
    q = pad(q, [(0, 0), (0, n_pad - n), (0, 0), (0, dkp - dk)])
    k = pad(k, [(0, 0), (0, n_pad - n), (0, 0), (0, dkp - dk)])
    v = pad(v, [(0, 0), (0, n_pad - n), (0, 0), (0, dvp - dv)])
    g = pad(g, [(0, 0), (0, n_pad - n), (0, 0)])
    beta = pad(beta, [(0, 0), (0, n_pad - n), (0, 0)])
    anc = pad(anc.astype(f32), [(0, 0), (0, n_pad - n), (0, n_pad - n)])
    s0 = pad(s0, [(0, 0), (0, 0), (0, dkp - dk), (0, dvp - dv)])
    prec = lax.Precision.HIGHEST if interpret else PRECISIONS[precision]
    params = pltriton.CompilerParams(num_warps=num_warps)
    tb, m, G = _prepare(q, k, g, beta, anc, h=h, rep=rep, interpret=interpret, precision=prec,
                        gram_inside=gram_inside, gram_precision=gram_precision, params=params, n=n)

    # grid: batch, value head, slice of the value dim, tile of nodes
    keys = pl.BlockSpec((None, n_pad, None, dkp), lambda bi, hi, ci, ti: (bi, 0, hi // rep, 0))
    vals = pl.BlockSpec((None, n_pad, None, block_dv), lambda bi, hi, ci, ti: (bi, 0, hi, ci))
    per_head = lambda *blk: pl.BlockSpec((None, None) + blk, lambda bi, hi, ci, ti: (bi, hi) + (0,) * len(blk))
    by_head = pl.BlockSpec((None, n_pad, None), lambda bi, hi, ci, ti: (bi, 0, hi))
    state = pl.BlockSpec((None, None, dkp, block_dv), lambda bi, hi, ci, ti: (bi, hi, 0, ci))
    o, delta = pl.pallas_call(
        functools.partial(_apply_kernel, precision=prec, key_chunk=key_chunk),
        out_shape=(jax.ShapeDtypeStruct((b, n_pad, h, dvp), f32),
                   jax.ShapeDtypeStruct((b, n_pad, h, dvp), f32)),
        grid=(b, h, dvp // block_dv, nt),
        in_specs=[keys, keys, vals, state, by_head] + [per_head(n_pad, n_pad)] * 2,
        out_specs=[vals, vals],
        compiler_params=params,
        interpret=interpret,
        name="tree_delta_rule_apply",
    )(q, k, v, s0, G, tb, m)
    return o[:, :n, :, :dv], delta[:, :n, :, :dv], G[:, :n]


# ---------------------------------------------------------------------------------------------- chains (prefill)

@functools.partial(jax.jit, static_argnames=("interpret", "precision", "gram_precision", "num_warps"))
def block_factors(q, k, g, beta, *, interpret=False, precision="ieee", gram_precision="tf32x3", num_warps=4):
    """`reference.block_factors` by `_prepare_kernel`, for blocks of a chain: q, k [B, C, Hk, Dk], g, beta
    [B, C, H], C a multiple of TILE up to MAX_N. Returns Tb, P [B, H, C, C] (zero above the diagonal) and G."""
    b, c, hk, dk = q.shape
    h = g.shape[2]
    if c % TILE or not supports(c):
        raise ValueError(f"block_factors: blocks of a multiple of {TILE} nodes up to {MAX_N}, got {c}")
    f32 = jnp.float32
    dkp = _pow2_at_least_16(dk)
    q, k = (jnp.pad(x.astype(f32), [(0, 0), (0, 0), (0, 0), (0, dkp - dk)]) for x in (q, k))
    low = jnp.tril(jnp.ones((c, c), bool))
    prec = lax.Precision.HIGHEST if interpret else PRECISIONS[precision]
    tb, p, G = _prepare(q, k, g.astype(f32), beta.astype(f32), jnp.broadcast_to(low.astype(f32), (b, c, c)), h=h,
                        rep=h // hk, interpret=interpret, precision=prec, gram_inside=c == TILE,
                        gram_precision=gram_precision, params=pltriton.CompilerParams(num_warps=num_warps), n=c,
                        write_p=True)
    # The kernel writes only the tiles on and below the diagonal.
    return jnp.where(low, tb, 0.0), jnp.where(low, p, 0.0), G


def _state_pass_kernel(w_ref, kdt_ref, tbv_ref, gl_ref, s0_ref, st_ref, delta_ref, s_ref, *, blocks, key_chunk,
                       precision):
    """One program per batch row, value head and slice of the value dim walks the chain's blocks in order, its
    state slice [Dk, block_dv] in registers as Dk / key_chunk pieces (every load is a [C, key_chunk] or [key_chunk,
    C] tile, never a whole [C, Dk] one): Delta = Tb V - W S to delta_ref[c], the state entering block c to
    st_ref[c], and S <- e^{G_last} S + Kd^T Delta."""
    dot = functools.partial(_dot, precision=precision)
    pieces = [pl.ds(i * key_chunk, key_chunk) for i in range(s0_ref.shape[0] // key_chunk)]

    def block(c, s):
        delta = tbv_ref[c] - sum(dot(w_ref[c, :, ks], si) for ks, si in zip(pieces, s))
        delta_ref[c] = delta
        for ks, si in zip(pieces, s):
            st_ref[c, ks, :] = si
        gl = gl_ref[c]
        return tuple(gl * si + dot(kdt_ref[c, ks, :], delta) for ks, si in zip(pieces, s))

    s = lax.fori_loop(0, blocks, block, tuple(s0_ref[ks, :] for ks in pieces))
    for ks, si in zip(pieces, s):
        s_ref[ks, :] = si


@functools.partial(jax.jit, static_argnames=("interpret", "block_dv", "key_chunk", "precision", "num_warps",
                                             "num_stages"))
def state_pass(w, eq, kdt, tbv, p, gl, s0, *, interpret=False, block_dv=32, key_chunk=32, precision="tf32x3",
               num_warps=4, num_stages=1):
    """`reference.state_pass` as one kernel for the serial part of a chain, without a launch per block. w, eq
    [B, NB, H, C, Dk]; kdt [B, NB, H, Dk, C] (Kd transposed); tbv [B, NB, H, C, Dv]; p [B, NB, H, C, C]; gl
    [B, NB, H]; s0 [B, H, Dk, Dv]; all fp32. The kernel's loop keeps only Delta = Tb V - W S and the state update,
    and writes Delta and the state entering every block ([B, NB, H, Dk, Dv] fp32: 400 MB a layer of an 8K prefill);
    O = E Q S + P Delta is then two batched products. block_dv: value columns per program; key_chunk: key dims per
    piece of the state (powers of two >= 16). precision: of the products. num_stages: Triton's software pipelining
    of the loop over blocks.
    The defaults are the fastest variant at the real shape (8K tokens, 48 heads, Dk = Dv = 128) on an H100: with O
    inside the loop, tf32x3 at 32 columns and one stage took 2.65 ms a layer, against 3.71 for ieee at 16 columns
    with Triton's own pipelining (which asked for more shared memory than the card has at 32 columns in tf32x3 and
    at 64 in either); taking O out of the loop then gave 2.36 against 3.00 ms in another lease. The first version,
    whole [C, Dk] tiles, took 108 ms a layer (bench/results/2026-12-06-h100-s61/ and -s62/). Until session 66 the
    pass wrote only the states, and O was M V + U S with M = P Tb and U = E Q - M E K: two more products and a
    subtraction over the whole chain."""
    b, nb, h, c, dk = w.shape
    dv = tbv.shape[-1]
    if c % TILE or c != pl.next_power_of_2(c):
        raise ValueError(f"state_pass: blocks of a power of two >= {TILE} nodes, got {c}")
    if precision not in PRECISIONS:
        raise ValueError(f"state_pass: precision={precision!r}; expected one of {', '.join(PRECISIONS)}")
    dkp, dvp = _pow2_at_least_16(dk), _pow2_at_least_16(dv)
    block_dv = min(_pow2_at_least_16(block_dv), dvp)
    key_chunk = min(_pow2_at_least_16(key_chunk), dkp)
    nbp = pl.next_power_of_2(nb)

    def pad(x, *dims):                  # dims: (axis, padded size); blocks always padded to nbp
        widths = [(0, 0)] * x.ndim
        widths[1] = (0, nbp - nb)
        for axis, size in dims:
            widths[axis] = (0, size - x.shape[axis])
        x = x.astype(jnp.float32)
        return jnp.pad(x, widths) if any(wd for _, wd in widths) else x

    w = pad(w, (4, dkp))
    kdt = pad(kdt, (3, dkp))
    tbv = pad(tbv, (4, dvp))
    gl = pad(gl)
    s0 = jnp.pad(s0.astype(jnp.float32), [(0, 0), (0, 0), (0, dkp - dk), (0, dvp - dv)])
    index = lambda bi, hi, vi: (bi, 0, hi, 0, 0)
    columns = lambda bi, hi, vi: (bi, 0, hi, 0, vi)
    state = pl.BlockSpec((None, None, dkp, block_dv), lambda bi, hi, vi: (bi, hi, 0, vi))
    prec = lax.Precision.HIGHEST if interpret else PRECISIONS[precision]
    states, delta, s = pl.pallas_call(
        functools.partial(_state_pass_kernel, blocks=nb, key_chunk=key_chunk, precision=prec),
        out_shape=(jax.ShapeDtypeStruct((b, nbp, h, dkp, dvp), jnp.float32),
                   jax.ShapeDtypeStruct((b, nbp, h, c, dvp), jnp.float32),
                   jax.ShapeDtypeStruct((b, h, dkp, dvp), jnp.float32)),
        grid=(b, h, dvp // block_dv),
        in_specs=[pl.BlockSpec((None, nbp, None, c, dkp), index), pl.BlockSpec((None, nbp, None, dkp, c), index),
                  pl.BlockSpec((None, nbp, None, c, block_dv), columns),
                  pl.BlockSpec((None, nbp, None), lambda bi, hi, vi: (bi, 0, hi)), state],
        out_specs=[pl.BlockSpec((None, nbp, None, dkp, block_dv), columns),
                   pl.BlockSpec((None, nbp, None, c, block_dv), columns), state],
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="chain_state_pass",
    )(w, kdt, tbv, gl, s0)
    # O = E Q S_in + P Delta for every block at once, S_in the state entering the block
    o = jnp.einsum("bnhck,bnhkv->bnhcv", eq.astype(jnp.float32), states[:, :nb, :, :dk, :dv], precision=prec)
    o = o + jnp.einsum("bnhij,bnhjv->bnhiv", p.astype(jnp.float32), delta[:, :nb, :, :, :dv], precision=prec)
    return o, s[:, :, :dk, :dv]
