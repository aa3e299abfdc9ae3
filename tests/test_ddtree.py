"""DDTree construction on the device (jaxspec/ddtree.py) against the paper's Algorithm 1 and brute force.

The device build must give the heap's nodes in the heap's pop order: scores float32 added root to
leaf, ties broken by the lexicographic rank tuple, ranks from a stable sort of each depth's row.
"""

from __future__ import annotations

import heapq
import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxspec import tree as trees
from jaxspec.ddtree import INVALID_TOKEN, build_tree

NEG_INF = np.float32(-np.inf)


def log(p):
    with np.errstate(divide="ignore"):
        return np.log(np.asarray(p, np.float32))


from_parents = jax.jit(trees.from_parents)


# ---------------------------------------------------------------------------------------------
# References (host, plain Python).


def ranked(lp_row, k):
    """Token ids of one depth's row by log-prob descending, equal values by lower id; first k."""
    return np.argsort(-lp_row, kind="stable")[:k]


def heap_reference(lp, budget):
    """The paper's Algorithm 1 on one sequence's lp [D, V] float32: a best-first heap over rank
    tuples. Returns the popped nodes in pop order as (token tuple, score, parent index), node 0
    being the root (not listed). A sibling's score is its parent's score plus its own log-prob
    (not the paper's score - lp[r] + lp[r+1]) so that rounding matches the device's sums."""
    depth_max, vocab = lp.shape
    k = min(budget, vocab)
    ids = [ranked(lp[d], k) for d in range(depth_max)]
    top = [lp[d][ids[d]] for d in range(depth_max)]
    # (-score, rank tuple, parent node, parent score): rank tuples are unique, so the heap compares
    # by score, then by the tuple lexicographically (a prefix before its extensions).
    heap = [(-top[0][0], (0,), 0, np.float32(0.0))]
    nodes = []
    while heap and len(nodes) < budget:
        neg, ranks, par, pscore = heapq.heappop(heap)
        score = np.float32(-neg)
        d, r = len(ranks), ranks[-1]
        prefix = nodes[par - 1][0] if par else ()
        nodes.append((prefix + (int(ids[d - 1][r]),), score, par))
        me = len(nodes)
        if r + 1 < k:
            s = np.float32(pscore + top[d - 1][r + 1])
            heapq.heappush(heap, (-s, ranks[:-1] + (r + 1,), par, pscore))
        if d < depth_max:
            s = np.float32(score + top[d][0])
            heapq.heappush(heap, (-s, ranks + (0,), me, score))
    return nodes


def brute_reference(lp, budget):
    """Every non-empty prefix of every token sequence, sorted by (score desc, rank tuple asc) with
    ranks over the whole vocabulary; the first `budget` as (token tuple, score)."""
    depth_max, vocab = lp.shape
    rank = [np.argsort(ranked(lp[d], vocab)) for d in range(depth_max)]   # token -> rank
    entries = []
    for length in range(1, depth_max + 1):
        for toks in itertools.product(range(vocab), repeat=length):
            s = np.float32(0.0)
            for d, t in enumerate(toks):
                s = np.float32(s + lp[d, t])
            entries.append((-s, tuple(int(rank[d][t]) for d, t in enumerate(toks)), toks, s))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [(e[2], e[3]) for e in entries[:budget]]


# ---------------------------------------------------------------------------------------------
# Reading the device output back.


def paths(parent, tokens):
    """Token tuple of every node (root: the empty tuple), from parents in a topological order."""
    out = [()]
    for i in range(1, len(parent)):
        out.append(out[parent[i]] + (int(tokens[i]),))
    return out


def valid_nodes(out, row):
    """[(token tuple, score, parent)] of the valid non-root nodes of one batch row, in node order."""
    parent = np.asarray(out.tree.parent[row])
    tokens = np.asarray(out.tokens[row])
    valid = np.asarray(out.valid[row])
    score = np.asarray(out.score[row])
    seqs = paths(parent, tokens)
    return [(seqs[i], score[i], int(parent[i])) for i in range(1, len(parent)) if valid[i]]


def check_structure(out, logp, root, budget):
    """Invariants every output must satisfy, whatever the scores."""
    logp = np.asarray(logp, np.float32)
    b, depth_max, vocab = logp.shape
    n = budget + 1
    tokens, parent, depth = (np.asarray(x) for x in (out.tokens, out.tree.parent, out.tree.depth))
    valid, score, anc = np.asarray(out.valid), np.asarray(out.score), np.asarray(out.tree.anc)
    assert tokens.shape == parent.shape == depth.shape == valid.shape == score.shape == (b, n)
    assert anc.shape == (b, n, n) and not out.tree.chain
    assert tokens.dtype == parent.dtype == depth.dtype == np.int32 and score.dtype == np.float32
    assert (tokens[:, 0] == np.asarray(root)).all() and (parent[:, 0] == -1).all()
    assert (depth[:, 0] == 0).all() and valid[:, 0].all() and (score[:, 0] == 0).all()
    ref = from_parents(parent)
    np.testing.assert_array_equal(np.asarray(ref.anc), anc)
    np.testing.assert_array_equal(np.asarray(ref.depth), depth)
    for r in range(b):
        i = np.arange(1, n)
        assert (parent[r, 1:] < i).all() and (parent[r, 1:] >= 0).all()        # parents first
        first_invalid = np.argmin(valid[r]) if not valid[r].all() else n
        assert valid[r, :first_invalid].all() and not valid[r, first_invalid:].any()
        inv = ~valid[r]
        assert (tokens[r, inv] == INVALID_TOKEN).all() and (parent[r, inv] == 0).all()
        assert (depth[r, inv] == 1).all() and (score[r, inv] == NEG_INF).all()
        ok = valid[r, 1:]
        assert valid[r, parent[r, 1:][ok]].all()                                   # prefix-closed
        assert (depth[r, 1:][ok] <= depth_max).all()
        assert ((tokens[r, 1:][ok] >= 0) & (tokens[r, 1:][ok] < vocab)).all()
        # Each node's score is its parent's plus its own token's log-prob at its depth, and finite.
        for j in np.nonzero(valid[r])[0][1:]:
            expect = np.float32(score[r, parent[r, j]] + logp[r, depth[r, j] - 1, tokens[r, j]])
            assert score[r, j] == expect and np.isfinite(score[r, j])
        assert (np.diff(score[r, 1:][ok]) <= 0).all()                             # score order
        # Siblings carry distinct tokens, so the accept walk's child is unambiguous.
        kids = {}
        for j in np.nonzero(valid[r])[0][1:]:
            key = (parent[r, j], tokens[r, j])
            assert key not in kids, f"duplicate child {key}"
            kids[key] = j


def check_against_heap(out, logp, budget):
    logp = np.asarray(logp, np.float32)
    for r in range(logp.shape[0]):
        ref = [(t, s, p) for t, s, p in heap_reference(logp[r], budget) if np.isfinite(s)]
        got = valid_nodes(out, r)
        assert [g[0] for g in got] == [e[0] for e in ref], f"row {r}: node order differs from the heap"
        assert [g[1] for g in got] == [e[1] for e in ref], f"row {r}: scores differ"
        assert [g[2] for g in got] == [e[2] for e in ref], f"row {r}: parents differ"


# ---------------------------------------------------------------------------------------------
# Random log-prob sets with and without ties.


def gen_logp(rng, b, d, v, kind):
    if kind == "normal":                     # no ties to speak of
        x = rng.normal(size=(b, d, v)) * 2
    elif kind == "coarse":                   # many equal log-probs in a row
        x = rng.integers(0, 3, size=(b, d, v)).astype(np.float64)
    elif kind == "integer":                  # exact sums: ties across depths and rows
        lp = -rng.integers(0, 4, size=(b, d, v)).astype(np.float32)
        lp[rng.random(lp.shape) < 0.25] = -np.inf
        return lp
    elif kind == "halves":                   # powers of two: log(1/4) == 2 log(1/2) in float32
        lp = (np.float32(np.log(0.5)) * rng.integers(0, 3, size=(b, d, v))).astype(np.float32)
        lp[rng.random(lp.shape) < 0.2] = -np.inf
        return lp
    elif kind == "onehot":                   # greedy-like rows: one token of probability 1
        lp = np.full((b, d, v), -np.inf, np.float32)
        lp[np.arange(b)[:, None], np.arange(d)[None, :], rng.integers(0, v, size=(b, d))] = 0.0
        return lp
    else:
        raise ValueError(kind)
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(x, jnp.float32), -1))
    mask = rng.random(lp.shape) < 0.15
    mask[..., 0] = False                     # keep each row a distribution
    lp = np.where(mask, -np.inf, lp).astype(np.float32)
    return lp


KINDS = ("normal", "coarse", "integer", "halves", "onehot")

# (depth, vocab, budget): small enough for brute force; includes V < B, B > all prefixes, B = 1.
GRID = [(1, 1, 1), (1, 3, 5), (2, 2, 7), (2, 3, 4), (3, 2, 20), (3, 3, 9), (3, 5, 13),
        (4, 3, 30), (4, 4, 1), (2, 8, 16), (4, 2, 40), (3, 6, 64)]


@pytest.mark.parametrize("depth,vocab,budget", GRID)
def test_matches_heap_and_brute_force(depth, vocab, budget):
    rng = np.random.default_rng(depth * 1000 + vocab * 10 + budget)
    for kind in KINDS:
        lp = gen_logp(rng, 6, depth, vocab, kind)
        root = rng.integers(0, vocab, size=6).astype(np.int32)
        out = build_tree(jnp.asarray(lp), jnp.asarray(root), budget)
        check_structure(out, lp, root, budget)
        check_against_heap(out, lp, budget)
        for r in range(lp.shape[0]):
            brute = [(t, s) for t, s in brute_reference(lp[r], budget) if np.isfinite(s)]
            got = [(t, s) for t, s, _ in valid_nodes(out, r)]
            assert got == brute, f"{kind} row {r}"


def test_references_agree():
    """The heap and the brute force are independent; check they agree before trusting either."""
    rng = np.random.default_rng(1)
    for depth, vocab, budget in GRID:
        for kind in KINDS:
            lp = gen_logp(rng, 1, depth, vocab, kind)[0]
            heap = [(t, s) for t, s, _ in heap_reference(lp, budget)]
            assert heap == brute_reference(lp, budget)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_matches_heap_hypothesis(data):
    depth, vocab, budget = data.draw(st.sampled_from([(2, 3, 5), (3, 4, 12), (4, 3, 25), (5, 2, 8)]))
    values = st.sampled_from([0.0, -0.5, -1.0, -1.5, -2.0, -np.log(2.0), -2 * np.log(2.0), -np.inf])
    lp = np.asarray(data.draw(st.lists(values, min_size=2 * depth * vocab, max_size=2 * depth * vocab)),
                    np.float32).reshape(2, depth, vocab)
    root = np.array([0, vocab - 1], np.int32)
    out = build_tree(jnp.asarray(lp), jnp.asarray(root), budget)
    check_structure(out, lp, root, budget)
    check_against_heap(out, lp, budget)


def test_worked_example():
    """reference/ddtree.md section 2.2: the pop order and q of the six nodes."""
    q = np.full((1, 3, 4), 1e-3)
    q[0, 0, :3] = [.664, .244, .09]
    q[0, 1, :3] = [.496, .449, .05]
    q[0, 2, :3] = [.92, .046, .03]
    out = build_tree(jnp.log(jnp.asarray(q, jnp.float32)), jnp.array([7], jnp.int32), 6)
    assert [n[0] for n in valid_nodes(out, 0)] == [(0,), (0, 0), (0, 0, 0), (0, 1), (0, 1, 0), (1,)]
    np.testing.assert_array_equal(np.asarray(out.tree.parent[0]), [-1, 0, 1, 2, 1, 4, 0])
    np.testing.assert_allclose(np.exp(np.asarray(out.score[0, 1:])),
                               [.664, .329, .303, .298, .274, .244], atol=6e-4)


# ---------------------------------------------------------------------------------------------
# Edge cases.


def test_budget_one_is_the_depth_one_argmax():
    lp = log(np.array([[[.1, .3, .3, .3], [.9, .05, .05, 0.]]], np.float32))
    out = build_tree(jnp.asarray(lp), jnp.array([2], jnp.int32), 1)
    np.testing.assert_array_equal(np.asarray(out.tokens), [[2, 1]])     # lowest id among equals
    np.testing.assert_array_equal(np.asarray(out.tree.parent), [[-1, 0]])
    assert np.asarray(out.valid).all()


def test_budget_beyond_all_prefixes():
    """V = 2, D = 3: 2 + 4 + 8 = 14 prefixes; the other 26 nodes are invalid."""
    rng = np.random.default_rng(3)
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(2, 3, 2)), jnp.float32), -1))
    out = build_tree(jnp.asarray(lp), jnp.array([0, 1], jnp.int32), 40)
    check_structure(out, lp, [0, 1], 40)
    assert (np.asarray(out.valid).sum(1) == 15).all()
    for r in range(2):
        assert {n[0] for n in valid_nodes(out, r)} == {
            t for k in (1, 2, 3) for t in itertools.product(range(2), repeat=k)}


def test_vocab_smaller_than_budget():
    lp = log(np.array([[[.7, .3], [.6, .4], [.5, .5]]], np.float32))
    out = build_tree(jnp.asarray(lp), jnp.array([1], jnp.int32), 5)
    check_structure(out, lp, [1], 5)
    check_against_heap(out, lp, 5)
    assert np.asarray(out.valid).all()


def test_minus_inf_rows():
    """-inf prefixes are never proposed: they become invalid nodes even when budget is left."""
    lp = log(np.array([[[.6, .4, 0.], [1., 0., 0.], [0., 0., 0.]],
                          [[0., 0., 0.], [.5, .5, 0.], [.5, .5, 0.]],
                          [[0., 1., 0.], [0., 0., 1.], [1., 0., 0.]]], np.float32))
    out = build_tree(jnp.asarray(lp), jnp.array([0, 1, 2], jnp.int32), 8)
    check_structure(out, lp, [0, 1, 2], 8)
    check_against_heap(out, lp, 8)
    assert [n[0] for n in valid_nodes(out, 0)] == [(0,), (0, 0), (1,), (1, 0)]
    assert valid_nodes(out, 1) == []                          # depth 1 all -inf: nothing to propose
    assert [n[0] for n in valid_nodes(out, 2)] == [(1,), (1, 2), (1, 2, 0)]     # a greedy chain
    np.testing.assert_array_equal(np.asarray(out.tree.parent[2, :4]), [-1, 0, 1, 2])


def test_nan_and_signed_zero():
    """NaN is read as -inf; -0.0 equals 0.0 (top_k alone would rank 0.0 above -0.0)."""
    lp = np.array([[[-0.0, 0.0, np.nan], [0.0, -0.0, -1.0]]], np.float32)
    out = build_tree(jnp.asarray(lp), jnp.array([0], jnp.int32), 8)
    clean = np.array([[[0.0, 0.0, -np.inf], [0.0, 0.0, -1.0]]], np.float32)
    check_structure(out, clean, [0], 8)
    check_against_heap(out, clean, 8)
    assert [n[0] for n in valid_nodes(out, 0)][:3] == [(0,), (0, 0), (0, 1)]


def test_root_only():
    lp = jnp.zeros((2, 3, 5), jnp.float32)
    out = build_tree(lp, jnp.array([4, 3], jnp.int32), 0)
    np.testing.assert_array_equal(np.asarray(out.tokens), [[4], [3]])
    assert out.tree.anc.shape == (2, 1, 1) and bool(out.tree.anc.all())
    out = build_tree(jnp.zeros((1, 0, 5), jnp.float32), jnp.array([4], jnp.int32), 3)
    check_structure(out, np.zeros((1, 0, 5), np.float32), [4], 3)
    assert np.asarray(out.valid).sum() == 1


def test_batch_rows_are_independent():
    rng = np.random.default_rng(5)
    lp = gen_logp(rng, 4, 3, 6, "normal")
    root = np.array([1, 2, 3, 4], np.int32)
    out = build_tree(jnp.asarray(lp), jnp.asarray(root), 12)
    for r in range(4):
        one = build_tree(jnp.asarray(lp[r:r + 1]), jnp.asarray(root[r:r + 1]), 12)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(one)):
            np.testing.assert_array_equal(np.asarray(a)[r:r + 1], np.asarray(b))


def test_inside_jit_with_traced_inputs():
    lp = jnp.asarray(gen_logp(np.random.default_rng(6), 1, 4, 9, "normal"))

    @jax.jit
    def f(lp, root):
        out = build_tree(lp, root, 10)
        return out.tokens, out.tree.parent

    tokens, parent = f(lp, jnp.array([3], jnp.int32))
    out = build_tree(lp, jnp.array([3], jnp.int32), 10)
    np.testing.assert_array_equal(tokens, out.tokens)
    np.testing.assert_array_equal(parent, out.tree.parent)


# ---------------------------------------------------------------------------------------------
# The real shape: V = 248320, D = 15.


def confident_logp(rng, depth, vocab):
    """[1, depth, vocab] log-probs of a confident drafter (top-1 about 0.9, then a few runners-up), so the
    best tree is deep and branchy."""
    x = rng.normal(size=(1, depth, vocab)).astype(np.float32)
    for d in range(depth):
        picks = rng.choice(vocab, 4, replace=False)
        x[0, d, picks[0]] += np.float32(16.0)
        x[0, d, picks[1:]] += np.float32(11.0)
    return np.asarray(jax.nn.log_softmax(jnp.asarray(x), -1))


@pytest.mark.parametrize("budget", [1, 64, 1024])
def test_real_shape(budget):
    vocab, depth = 248320, 15
    lp = confident_logp(np.random.default_rng(budget), depth, vocab)
    t0 = time.perf_counter()
    out = jax.block_until_ready(build_tree(jnp.asarray(lp), jnp.array([17], jnp.int32), budget))
    elapsed = time.perf_counter() - t0
    assert elapsed < 30, f"compile + run took {elapsed:.1f} s"
    check_structure(out, lp, [17], budget)
    check_against_heap(out, lp, budget)
    assert np.asarray(out.valid).all()
    assert int(np.asarray(out.tree.depth).max()) == (1 if budget == 1 else depth)


def test_vocab_is_never_fully_sorted():
    """Only top_k may touch the vocabulary axis. XLA turns top_k into a full sort when the slices
    after it fold into its own (seen: 466 ms instead of 6 ms per build on CPU); the compiled program
    must contain no sort whose operand spans the vocabulary."""
    vocab = 248320
    hlo = build_tree.lower(jnp.zeros((1, 15, vocab), jnp.float32), jnp.zeros((1,), jnp.int32),
                           64).compile().as_text()
    sorts = [line for line in hlo.splitlines() if " sort(" in line and str(vocab) in line]
    assert not sorts, sorts[0][:200]


@pytest.mark.parametrize("kind", ["integer", "halves", "coarse"])
def test_ties_at_scale(kind):
    """Many equal scores where the vocabulary and beams are large enough that XLA uses its real top-k
    (a library call on CPU, not the small-array path): the tie order must still be the heap's."""
    rng = np.random.default_rng(11)
    lp = gen_logp(rng, 2, 7, 3000, kind)
    root = np.array([1, 2], np.int32)
    out = build_tree(jnp.asarray(lp), jnp.asarray(root), 300)
    check_structure(out, lp, root, 300)
    check_against_heap(out, lp, 300)
    assert np.asarray(out.valid).sum() > 100


# The sort-free selections (JAXSPEC_DDTREE_TOP_K=count, the GPU's default). The whole file also passes with
# the variable set to count (run it so to check every case above); here both methods on the same inputs.


@pytest.fixture
def top_k_env(monkeypatch):
    """Sets JAXSPEC_DDTREE_TOP_K; it is read when a function is traced, so jit caches are dropped around."""
    def use(method):
        monkeypatch.setenv("JAXSPEC_DDTREE_TOP_K", method)
        jax.clear_caches()
    yield use
    monkeypatch.delenv("JAXSPEC_DDTREE_TOP_K")
    jax.clear_caches()


@pytest.mark.parametrize("method", ["sort", "count"])
def test_vocab_top_k_equals_stable_top_k_either_way(method, top_k_env, monkeypatch):
    """Both methods as a GPU runs them (there "sort" ranks the vocabulary in chunks; a CPU's "sort" is lax.top_k
    whole, the very reference, so it is not tested unpatched)."""
    from jaxspec.ddtree import vocab_top_k
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    top_k_env(method)
    rng = np.random.default_rng(1)
    for v, k in ((248320, 64), (248320, 63), (20000, 64), (10000, 3), (5000, 2048), (4097, 1), (300, 64),
                 (70000, 256)):
        # Coarse values make many ties across chunks; -inf rows check the padding never wins.
        x = rng.integers(-40, 0, (2, 3, v)).astype(np.float32)
        x[1, 2] = -np.inf
        x[1, 2, [5, v - 1]] = -1.0
        got = jax.jit(vocab_top_k, static_argnums=1)(jnp.asarray(x), k)
        want = jax.lax.top_k(jnp.asarray(x), k)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_counted_vocab_top_k_levels():
    """The vocabulary is counted in rows of at most COUNT_ROW while chunking shrinks it: at the real shape
    three rows of about 1000 (session 46; before, 3880 chunk maxima and 4032 candidates); a budget too large to
    shrink the row counts it whole, and top_k_method then sorts."""
    from jaxspec import ddtree
    assert ddtree._count_plan(248320, 63) == [970, 1008, 1008]
    assert ddtree._count_plan(248320, 8) == [970, 128, 128]
    assert ddtree._count_plan(300, 64) == [300]
    assert ddtree._count_plan(248320, 1024) == [248320]


@pytest.mark.parametrize("kind", ["integer", "coarse", "normal"])
@pytest.mark.parametrize("c", [4096, 3969, 945, 3])   # B = 64 and 63 beams (64 x 64, 63 x 63), odd final rows
def test_counted_selections_equal_top_k(kind, c):
    from jaxspec.ddtree import counted_top_k, counted_top_k_set
    rng = np.random.default_rng(5 + c)
    x = gen_logp(rng, 3, 1, c, kind)[:, 0] if kind != "normal" else rng.normal(size=(3, c)).astype(np.float32)
    x[2, :100] = -np.inf
    x[1, -2:] = -np.inf             # -inf ties at the end of a row: the lower index first
    for k in sorted({1, min(64, c), c}):
        val, idx = jax.lax.top_k(jnp.asarray(x), k)
        got_val, got_idx = counted_top_k(jnp.asarray(x), k)
        np.testing.assert_array_equal(got_idx, idx)
        np.testing.assert_array_equal(got_val, val)
        np.testing.assert_array_equal(counted_top_k_set(jnp.asarray(x), k), np.sort(np.asarray(idx), -1))


@pytest.mark.parametrize("c", [1, 15, 16, 17, 64, 65, 961, 1024, 3969, 4096])
def test_running_count_equals_cumsum(c):
    from jaxspec.ddtree import running_count
    rng = np.random.default_rng(c)
    for p in (0.05, 0.5, 0.97):                         # sparse, even and dense masks
        mask = rng.random((2, 3, c)) < p
        got = jax.jit(running_count)(jnp.asarray(mask))
        assert got.dtype == jnp.int32 and got.shape == mask.shape
        np.testing.assert_array_equal(got, np.cumsum(mask, -1))


def test_count_is_the_gpu_default_and_only_up_to_its_size(monkeypatch):
    from jaxspec import ddtree
    monkeypatch.delenv("JAXSPEC_DDTREE_TOP_K", raising=False)
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert ddtree.top_k_method(4096) == "sort"                 # O(C^2) comparisons: slow on a CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert ddtree.top_k_method(4096) == "count" and ddtree.top_k_method(4097) == "sort"
    monkeypatch.setenv("JAXSPEC_DDTREE_TOP_K", "sort")
    assert ddtree.top_k_method(4096) == "sort"
    monkeypatch.setenv("JAXSPEC_DDTREE_TOP_K", "count")
    assert ddtree.top_k_method(4096) == "count" and ddtree.top_k_method(4097) == "sort"
    monkeypatch.setenv("JAXSPEC_DDTREE_TOP_K", "sort")
    assert ddtree.top_k_method(16) == "sort"
    monkeypatch.setenv("JAXSPEC_DDTREE_TOP_K", "radix")
    with pytest.raises(ValueError, match="JAXSPEC_DDTREE_TOP_K='radix'"):
        ddtree.top_k_method(16)


def test_counted_tree_at_the_real_shape_has_no_sort_and_equals_the_sorted_one(top_k_env):
    """B = 64 at the real vocabulary: counting replaces every sort of the build (0.70 of its 0.89 ms on the
    H200), and the tree is the same, node for node, as with lax.top_k and as the paper's heap's."""
    vocab, depth, budget = 248320, 15, 64
    lp = confident_logp(np.random.default_rng(3), depth, vocab)
    root = jnp.array([17], jnp.int32)
    trees_by = {}
    for method in ("sort", "count"):
        top_k_env(method)
        fn = jax.jit(build_tree.__wrapped__, static_argnames=("budget",))
        hlo = fn.lower(jnp.asarray(lp), root, budget=budget).compile().as_text()
        sorts = [line for line in hlo.splitlines() if " sort(" in line]
        assert (len(sorts) == 0) == (method == "count"), (method, len(sorts))
        trees_by[method] = fn(jnp.asarray(lp), root, budget=budget)
    for a, b in zip(jax.tree.leaves(trees_by["count"]), jax.tree.leaves(trees_by["sort"])):
        np.testing.assert_array_equal(a, b)
    check_against_heap(trees_by["count"], lp, budget)
