"""DDTree draft trees built on the device, exactly (DESIGN.md section 3, reference/ddtree.md section 2).

The drafter gives D independent per-depth distributions q_1..q_D. A prefix u = (u_1..u_k), k <= D,
scores s(u) = log q_1(u_1) + ... + log q_k(u_k); the best tree of budget B is the B best prefixes,
which is prefix-closed (paper Props 1-3). The paper pops them from a host heap; here the same nodes
come out of one compiled program with no host round trip.

The order (what "best" means, including ties). Per depth, `lax.top_k` ranks the vocabulary (stable:
equal log-probs rank the lower token id first) and only ranks < K = min(B, V) are used (Lemma 1), so
a prefix is a rank tuple (r_1..r_k). Prefixes are totally ordered by score descending, then rank
tuple ascending lexicographically with a proper prefix before its extensions: exactly the pop order
of the paper's heap of (-score, rank tuple). Scores are float32 sums accumulated root to leaf,
s(u + r) = fl(s(u) + logp_d[r]); the paper's heap gets a sibling's score as score - lp[r] + lp[r+1],
which rounds differently, so a reference must add from the parent to match bit for bit.

This order is topological: logp <= 0 gives s(child) <= s(parent), and on a tie the parent's tuple
is a prefix of the child's. The next sibling never beats the previous one either (top_k sorts).
So the best B prefixes are the first B of this order and form a prefix-closed, sibling-closed set.

Construction. Let S be that set. For each depth d, beam_d = the best min(B, K^d) children (in the
order above) of beam_{d-1}. By induction beam_d contains S at depth d: a u in S has its parent in S,
hence in beam_{d-1}, so u is a candidate; if B candidates came before u, u would be beyond place B.
This holds with float rounding and -inf; it does need the exact tie order inside each beam top-k,
which is why every beam is kept in lexicographic order: the candidates [parent, rank] then flatten in
lexicographic order and a stable `lax.top_k` breaks ties by it. The final pick ranks all beam
entries (at most D*B) by score and then by their DFS preorder in the forest of beam entries, which
is the lexicographic order of their rank tuples across depths. Memory is O(B * K) per depth for the
candidates, never O(V^D); the vocabulary is touched only by the one top_k over [batch, D, V].

Invalid nodes. Fewer than B real prefixes exist when V + V^2 + ... + V^D < B, and a prefix with
score -inf (a token the sampling settings removed) must never be proposed. Such nodes still fill the
static N = B + 1 slots, always after every valid node: they get token -1 (never equal to a target
choice, so the accept walk, which follows parent == cur & token == choice, never enters them),
parent 0, depth 1, score -inf, ancestors {root, self} (no row is all-masked), and valid False.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxspec import sharding
from jaxspec import tree as trees
from pallas_kernels.dispatch import DDTREE_TOP_K_METHODS

INVALID_TOKEN = -1


class DDTree(NamedTuple):
    """tokens [b, N] int32 (root_token at node 0, INVALID_TOKEN at invalid nodes); tree: parent,
    depth, anc in score order; valid [b, N] bool (root True); score [b, N] float32 (0 at the root,
    -inf at invalid nodes, the prefix's summed log-prob otherwise)."""

    tokens: jax.Array
    tree: trees.Tree
    valid: jax.Array
    score: jax.Array


def _segment_sum(x, seg, num):
    """Per batch row: out[b, s] = sum of x[b, j] over j with seg[b, j] == s."""
    rows = jnp.arange(x.shape[0])[:, None]
    return jnp.zeros((x.shape[0], num), x.dtype).at[rows, seg].add(x)


def _gather(x, idx):
    return jnp.take_along_axis(x, idx, 1)


def _ancestors(parent, max_depth):
    """anc [b, N, N] ancestor-or-self by chasing parents max_depth times (parent[:, 0] == -1)."""
    b, n = parent.shape
    cols = jnp.arange(n, dtype=jnp.int32)
    anc = jnp.broadcast_to(jnp.eye(n, dtype=bool), (b, n, n))
    cur = parent
    for _ in range(max_depth):
        anc = anc | (cur[..., None] == cols)
        cur = jnp.where(cur >= 0, _gather(parent, jnp.maximum(cur, 0)), -1)
    return anc


def _root_only(root_token, budget):
    """The root and `budget` invalid nodes: budget 0, or a drafter with no depths (D == 0)."""
    b = root_token.shape[0]
    n = budget + 1
    first = jnp.arange(n) == 0
    tokens = jnp.where(first, root_token[:, None].astype(jnp.int32), INVALID_TOKEN)
    parent = jnp.broadcast_to(jnp.where(first, -1, 0).astype(jnp.int32), (b, n))
    valid = jnp.broadcast_to(first, (b, n))
    score = jnp.broadcast_to(jnp.where(first, 0.0, -jnp.inf).astype(jnp.float32), (b, n))
    anc = _ancestors(parent, 1)
    tree = trees.Tree(parent, (parent >= 0).astype(jnp.int32), anc)
    return DDTree(tokens, tree, valid, score)


_VOCAB_CHUNK = 2048

# How the tree's top-k selections run: "sort" (lax.top_k, which XLA's GPU backend lowers to sort kernels)
# or "count" (each entry's rank counted by comparisons, no sort). On the H200 the sorts were 0.70 of a
# DDTree(64) round's 0.89 ms tree build: 33 sort kernels, ~30 us each even on 4096 entries
# (bench/results/2026-11-30-h200-s10-rounds-1k, 16-layer trace). Counting does O(C^2) comparisons, which
# a GPU does in one fused reduction (16-layer DDTree(64) round 9.31 -> 9.00 ms,
# bench/results/2026-11-30-h200-s11-kernels) and a CPU does slowly. So "count" is the default on a GPU and
# "sort" elsewhere; JAXSPEC_DDTREE_TOP_K=sort|count (read when the tree is traced) forces either.
# Both give lax.top_k's result exactly on the values build_tree ranks (no NaN, no -0.0).
# Counting is used only on rows of at most COUNT_MAX entries (16.8M comparisons a row): at the real shape that
# is every selection of a tree of up to 64 nodes (beams of 64 x 64 candidates, 15 x 64 final entries, the
# vocabulary in levels of at most COUNT_ROW chunks); larger ones sort.
TOP_K_ENV = "JAXSPEC_DDTREE_TOP_K"
COUNT_MAX = 4096


def top_k_method(c: int) -> str:
    """The method for rows of c entries."""
    m = os.environ.get(TOP_K_ENV) or ("count" if jax.default_backend() == "gpu" else "sort")
    if m not in DDTREE_TOP_K_METHODS:
        raise ValueError(f"{TOP_K_ENV}={m!r}: expected one of {', '.join(DDTREE_TOP_K_METHODS)}")
    return m if c <= COUNT_MAX else "sort"


def count_ranks(x):
    """Each entry's place in lax.top_k's stable order over the last axis (value descending, then index
    ascending): how many entries come before it. x without NaN or -0.0 (top_k's total order puts NaN
    first and -0.0 below 0.0; comparisons do not)."""
    c = x.shape[-1]
    i = jnp.arange(c)
    xi, xj = x[..., :, None], x[..., None, :]
    before = (xj > xi) | ((xj == xi) & (i[None, :] < i[:, None]))
    return jnp.sum(before, -1, dtype=jnp.int32)


def _place(ranks, k):
    """[..., C] distinct places -> [..., k] int32: the entry at each place < k (a permutation's inverse)."""
    lead, c = ranks.shape[:-1], ranks.shape[-1]
    r = ranks.reshape(-1, c)
    rows = jnp.arange(r.shape[0])[:, None]
    src = jnp.broadcast_to(jnp.arange(c, dtype=jnp.int32), r.shape)
    out = jnp.zeros((r.shape[0], k), jnp.int32).at[rows, jnp.where(r < k, r, k)].set(src, mode="drop")
    return out.reshape(lead + (k,))


def counted_top_k(x, k: int):
    """lax.top_k(x, k) by counting (see count_ranks for the values it takes)."""
    idx = _place(count_ranks(x), k)
    return jnp.take_along_axis(x, idx, -1), idx


def running_count(mask, block: int = 64):
    """jnp.cumsum(mask, -1) of a boolean mask as int32, by two reductions: within blocks of `block`
    entries, then over the block totals. XLA's own cumsum (a reduce-window tree of 16-wide levels) fuses
    two levels into one small loop kernel when the length is not a multiple of 256: on the H200 that
    kernel took ~9.7 us a call at B = 63 (3969 entries) against ~1.3 us at B = 64 (4096), 14 calls a tree
    (bench/results/2026-12-01-h200-s16-table)."""
    c = mask.shape[-1]
    r = -(-c // block)
    lead = mask.shape[:-1]
    m = jnp.pad(mask.astype(jnp.int32), [(0, 0)] * len(lead) + [(0, r * block - c)]).reshape(lead + (r, block))
    j = jnp.arange(block)
    within = jnp.sum(m[..., None, :] * (j[None, :] <= j[:, None]), -1)        # [..., r, block], inclusive
    q = jnp.arange(r)
    carry = jnp.sum(within[..., None, :, -1] * (q[None, :] < q[:, None]), -1)  # [..., r]: earlier blocks
    return (within + carry[..., None]).reshape(lead + (r * block,))[..., :c].astype(jnp.int32)


def counted_top_k_set(x, k: int):
    """The indices of lax.top_k(x, k) in ascending index order, by counting."""
    chosen = count_ranks(x) < k
    return _place(jnp.where(chosen, running_count(chosen) - 1, k), k)


def top_k_set(x, k: int):
    """The indices of lax.top_k(x, k) in ascending index order, by the method in force."""
    if top_k_method(x.shape[-1]) == "sort":
        return jnp.sort(jax.lax.top_k(x, k)[1].astype(jnp.int32), axis=-1)
    return counted_top_k_set(x, k)


def top_k(x, k: int):
    """lax.top_k(x, k) (values, int32 indices) by the method in force."""
    if top_k_method(x.shape[-1]) == "sort":
        val, idx = jax.lax.top_k(x, k)
        return val, idx.astype(jnp.int32)
    return counted_top_k(x, k)


def vocab_top_k(x, k: int):
    """`lax.top_k` over the last axis in stages, without ranking the whole vocabulary at once.

    "sort" (see TOP_K_ENV): on a GPU per chunk of 2048, then over the chunk winners. On the H200 (2026-11-29) XLA
    lowered top_k over the 248320-token axis to a full sort of it (1.5 ms per tree at B = 64); sorting
    2048-wide rows is cheap. Elsewhere lax.top_k whole: XLA's CPU top_k is a partial sort, 2-6x faster there than
    the chunks at V = 248320 (0.48 against 1.57 ms for one row at k = 20, 6.9 against 40.7 for [15, V] at k = 64,
    bench/results/2026-12-05-cpu-s48-sampling/). "count": the k best chunks by their maximum, then the k best of
    their entries, the same way again while they are more than COUNT_ROW (_counted_vocab_top_k). Same result as a stable
    top_k either way (among equal values, the lower index) on rows without NaN or -0.0, the rows build_tree and
    jaxspec.sampling rank; k may not pass the row's length (lax.top_k refuses that too).
    """
    if not 0 <= k <= x.shape[-1]:
        raise ValueError(f"vocab_top_k: k = {k} must be in [0, {x.shape[-1]}] (the row's length)")
    local = _counted_vocab_top_k if top_k_method(max(_count_plan(x.shape[-1], k))) == "count" else _chunked_top_k
    split = sharding.vocab_top_k(x, k, local)  # a tensor-parallel vocabulary: per shard, then across
    return local(x, k) if split is None else split


# The longest row _counted_vocab_top_k ranks by counting when it has a choice (C^2 comparisons a row). Until
# session 46 it cut the vocabulary once, into chunks of about sqrt(V / k): at V = 248320, k = 63 that counted
# rows of 3880 chunk maxima and 4032 candidates, 31M comparisons a depth, two reductions of ~87 and ~151 us a
# tree on the H200 (bench/results/2026-12-04-h200-s46/call2-round-trace/). Three levels of at most 1024 (970
# chunks of 256, 1008 chunks of 16, 1008 candidates) do 3M: the whole build on the H200 went from 0.558 to
# 0.315 ms at B = 63, 0.448 to 0.301 at B = 64 (bench/results/2026-12-05-h200-s52/build-levels/).
COUNT_ROW = 1024


def _level(v: int, k: int) -> int | None:
    """The chunk size of one level of _counted_vocab_top_k over v entries: the smallest power of two >= 16 that
    leaves at most max(COUNT_ROW, k) chunks; None where the v entries are counted whole (short enough, or
    chunking would not shrink them)."""
    if v <= max(COUNT_ROW, k):
        return None
    c = 16
    while -(-v // c) > max(COUNT_ROW, k):
        c *= 2
    return None if k * c >= v else c


def _count_plan(v: int, k: int) -> list[int]:
    """The row lengths _counted_vocab_top_k counts over v entries: each level's chunk count, then the last
    candidates."""
    rows = []
    while (c := _level(v, k)) is not None:
        rows.append(-(-v // c))
        v = k * c
    return rows + [v]


def _counted_vocab_top_k(x, k: int):
    """top_k over the last axis by counting, in small steps. Cut it into n chunks of c entries (n at most
    COUNT_ROW); take the k best chunks by (maximum descending, chunk index ascending); then the k best of their
    k * c entries, by the same steps while they are more than COUNT_ROW. Exact: if an entry x_i of the true top
    k sat in an unchosen chunk, the k chosen chunks would each hold an entry that comes before x_i (its
    maximum, which is larger, or equal and at a lower index), so k entries would come before x_i. The chosen
    chunks' entries are kept in ascending index order, so a lower position among them is a lower index."""
    v = x.shape[-1]
    c = _level(v, k)
    if c is None:
        return counted_top_k(x, k)
    n = -(-v // c)
    lead = x.shape[:-1]
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n * c - v)], constant_values=-jnp.inf)
    xc = xp.reshape(lead + (n, c))
    chunks = counted_top_k_set(xc.max(-1), k)                               # [..., k], ascending
    cand = jnp.take_along_axis(xc, chunks[..., None], -2).reshape(lead + (k * c,))
    gidx = (chunks[..., None] * c + jnp.arange(c, dtype=jnp.int32)).reshape(lead + (k * c,))
    val, pos = _counted_vocab_top_k(cand, k)                                # cand is in gidx order
    # Padding (-inf, past every real index) is chosen only when fewer than k entries exist at all.
    return val, jnp.minimum(jnp.take_along_axis(gidx, pos, -1), v - 1)


def _chunked_top_k(x, k: int):
    v = x.shape[-1]
    if v <= 2 * _VOCAB_CHUNK or k > _VOCAB_CHUNK or jax.default_backend() != "gpu":
        return jax.lax.top_k(x, k)
    n = -(-v // _VOCAB_CHUNK)
    pad = n * _VOCAB_CHUNK - v
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)], constant_values=-jnp.inf)
    val, idx = jax.lax.top_k(xp.reshape(x.shape[:-1] + (n, _VOCAB_CHUNK)), k)
    idx = idx + (jnp.arange(n, dtype=idx.dtype) * _VOCAB_CHUNK)[:, None]
    val, pos = jax.lax.top_k(val.reshape(x.shape[:-1] + (n * k,)), k)
    idx = jnp.take_along_axis(idx.reshape(x.shape[:-1] + (n * k,)), pos, -1)
    # Padding ranks after every real entry (it sits at the highest indices), so it is chosen only when
    # fewer than k entries exist at all; clamp its index (its -inf score makes the node invalid).
    return val, jnp.minimum(idx, v - 1)


@functools.partial(jax.jit, static_argnames=("budget",))
def build_tree(logp, root_token, budget: int) -> DDTree:
    """The best DDTree of `budget` drafted nodes under per-depth log-probs logp [b, D, V] (depth d
    uses row d - 1; -inf allowed; NaN is read as -inf, values >= 0 including -0.0 as 0.0), rooted at
    root_token [b]. N = budget + 1 nodes per row in the order described in the module docstring
    (root first, then score descending, ties by rank tuple), so parents precede children; invalid
    nodes, if any, come last. `budget` is static; jit once per (shape, budget)."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    b, n_depth, vocab = logp.shape
    if budget == 0 or n_depth == 0:
        return _root_only(root_token, budget)
    k = min(budget, vocab)
    logp = logp.astype(jnp.float32)
    # top_k compares floats in total order (0.0 above -0.0, NaN above everything), which would rank
    # equal log-probs apart and could put a child (parent -0.0 plus lp 0.0) before its parent.
    logp = jnp.where(logp < 0, logp, jnp.where(jnp.isnan(logp), -jnp.inf, 0.0))
    # The barrier keeps XLA from folding the per-depth slices below into top_k's own slice, which
    # hides the top-k pattern and turns it into a full sort of the vocabulary (50x slower on CPU).
    top_lp, top_id = jax.lax.optimization_barrier(vocab_top_k(logp, k))     # [b, D, K], stable ties
    top_id = top_id.astype(jnp.int32)

    # Beams in lexicographic order of rank tuples: par = position of the parent in the previous beam.
    scores = [top_lp[:, 0]]
    pars = [jnp.zeros((b, k), jnp.int32)]
    ranks = [jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))]
    for d in range(1, n_depth):
        width = scores[-1].shape[1]
        cand = (scores[-1][:, :, None] + top_lp[:, d, None, :]).reshape(b, width * k)
        keep = min(budget, width * k)
        if keep == width * k:                         # tiny vocabularies: every candidate survives
            idx = jnp.broadcast_to(jnp.arange(keep, dtype=jnp.int32), (b, keep))
        else:
            # Stable top_k: among equal scores the lower flat index, i.e. the lexicographically
            # smaller tuple, wins. Sorting the winners' indices restores lexicographic order.
            idx = top_k_set(cand, keep)
        scores.append(_gather(cand, idx))
        pars.append(idx // k)
        ranks.append(idx % k)
    widths = [s.shape[1] for s in scores]

    # DFS preorder of the beam forest (children in rank order) = lexicographic order across depths.
    sizes = [None] * n_depth
    sizes[-1] = jnp.ones((b, widths[-1]), jnp.int32)
    for d in range(n_depth - 2, -1, -1):
        sizes[d] = 1 + _segment_sum(sizes[d + 1], pars[d + 1], widths[d])
    pres, parent_pres = [], []
    up = jnp.full((b, 1), -1, jnp.int32)              # the root's preorder, one slot
    for d in range(n_depth):
        sz = sizes[d]
        group = _segment_sum(sz, pars[d], up.shape[1])
        before_group = jnp.cumsum(group, 1) - group   # nodes in earlier parents' subtrees
        before_self = jnp.cumsum(sz, 1) - sz
        pp = _gather(up, pars[d])
        pres.append(pp + 1 + before_self - _gather(before_group, pars[d]))
        parent_pres.append(pp)
        up = pres[-1]

    pre = jnp.concatenate(pres, 1)                    # a permutation of 0..M-1 per row
    m = pre.shape[1]
    rows = jnp.arange(b)[:, None]

    def by_pre(x):
        return jnp.zeros((b, m), x.dtype).at[rows, pre].set(x)

    score_p = by_pre(jnp.concatenate(scores, 1))
    parent_p = by_pre(jnp.concatenate(parent_pres, 1))
    depth_p = by_pre(jnp.concatenate([jnp.full((b, w), d + 1, jnp.int32) for d, w in enumerate(widths)], 1))
    token_p = by_pre(jnp.concatenate([_gather(top_id[:, d], ranks[d]) for d in range(n_depth)], 1))

    # Laid out in preorder, a stable top_k orders by (score desc, rank tuple asc): the heap's order.
    n_sel = min(budget, m)
    sel_score, sel = top_k(score_p, n_sel)
    node_of = jnp.zeros((b, m), jnp.int32).at[rows, sel].set(jnp.arange(1, n_sel + 1, dtype=jnp.int32))
    sel_parent_pre = _gather(parent_p, sel)
    # A selected node's parent precedes it in the order, so it was selected too (node_of > 0).
    sel_parent = jnp.where(sel_parent_pre >= 0, _gather(node_of, jnp.maximum(sel_parent_pre, 0)), 0)

    pad = budget - n_sel                              # more budget than prefixes exist
    def fill(x, v):
        return jnp.pad(x, ((0, 0), (0, pad)), constant_values=v)

    valid = fill(sel_score > -jnp.inf, False)
    tokens = jnp.where(valid, fill(_gather(token_p, sel), INVALID_TOKEN), INVALID_TOKEN)
    parent = jnp.where(valid, fill(sel_parent, 0), 0)
    depth = jnp.where(valid, fill(_gather(depth_p, sel), 1), 1)
    score = jnp.where(valid, fill(sel_score, -jnp.inf), -jnp.inf)

    def with_root(x, v):
        return jnp.concatenate([jnp.broadcast_to(jnp.asarray(v, x.dtype), (b, 1)), x], 1)

    tokens = with_root(tokens, 0).at[:, 0].set(root_token.astype(jnp.int32))
    parent = with_root(parent, -1)
    depth = with_root(depth, 0)
    valid = with_root(valid, True)
    score = with_root(score, 0.0)
    anc = _ancestors(parent, n_depth)
    return DDTree(tokens, trees.Tree(parent, depth, anc, max_depth=n_depth), valid, score)
