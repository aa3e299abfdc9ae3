"""The DDTree builder's input rules and the DFlash speculator's settings, as callers rely on them.

build_tree: a negative budget is refused by name; log-probs at or above zero (rounding, +inf, a caller's
unnormalised scores) count as 0.0, so no node outscores its parent; the tree declares the drafter's depth as
its deepest level, and a target agreeing with the whole drafted spine accepts all of it plus the root.
DFlash: it drafts the block the drafter was trained with unless told otherwise; block sizes and budgets out
of range are refused naming the flag and the allowed range; a DDTree proposal is the best tree of the very
distribution the round verifies against (the drafter's softmax when greedy, its temperature and top-k
transform when sampling), so a sampled tree never drafts a token the sampling settings removed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import ConfigError
from jaxspec.ddtree import build_tree
from jaxspec.dflash import DFlash, block_size_for
from jaxspec.engine import Engine, accept
from jaxspec.sampling import Sampling, log_probs
from test_dflash import pair  # noqa: F401 (a fixture)


def random_logp(rng, b, d, v, scale=2.0):
    return np.asarray(jax.nn.log_softmax(jnp.asarray(rng.normal(size=(b, d, v)) * scale, jnp.float32), -1))


@pytest.mark.parametrize("budget", [-1, -7])
def test_negative_budget_is_refused_by_name(budget):
    lp = random_logp(np.random.default_rng(1 - budget), 1, 3, 5)
    with pytest.raises(ValueError, match=rf"^budget must be >= 0, got {budget}(\s|$)"):
        build_tree(jnp.asarray(lp), jnp.array([2], jnp.int32), budget)


def test_log_probs_at_or_above_zero_count_as_zero():
    """A tree from log-probs with positive entries (and +inf) is the tree with those entries at 0.0: a
    probability of 1, never more, so every node's score stays <= its parent's."""
    rng = np.random.default_rng(21)
    lp = random_logp(rng, 3, 3, 6)
    hit = rng.random(lp.shape) < 0.3
    above = lp.copy()
    above[hit] = rng.uniform(0.01, 3.0, int(hit.sum())).astype(np.float32)
    above[0, 1, 2], above[2, 0, 5] = np.inf, np.inf
    assert (above > 0).sum() >= 10
    clamped = np.where(above >= 0, np.float32(0.0), above)
    root = jnp.asarray(rng.integers(0, 6, size=3), jnp.int32)
    got = build_tree(jnp.asarray(above), root, 12)
    want = build_tree(jnp.asarray(clamped), root, 12)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b)
    score, parent, valid = (np.asarray(x) for x in (got.score, got.tree.parent, got.valid))
    for r in range(3):
        kids = np.nonzero(valid[r, 1:])[0] + 1
        assert len(kids) == 12 and (score[r, kids] <= score[r, parent[r, kids]]).all()


@pytest.mark.parametrize("depth", [2, 3, 6])
def test_a_target_agreeing_with_the_whole_spine_accepts_all_of_it(depth):
    """A confident drafter's best path (its top token at every depth) is drafted to the full depth; the tree
    declares that depth as its deepest, and the accept walk with a target choosing the spine's next token at
    every node takes the root and all `depth` drafted nodes."""
    rng = np.random.default_rng(50 + depth)
    b, vocab, budget = 2, 7, 9
    x = rng.normal(size=(b, depth, vocab)).astype(np.float32)
    spine = rng.integers(0, vocab, size=(b, depth))
    x[np.arange(b)[:, None], np.arange(depth)[None, :], spine] += np.float32(8.0)
    lp = jax.nn.log_softmax(jnp.asarray(x), -1)
    root = jnp.asarray(rng.integers(0, vocab, size=b), jnp.int32)
    out = build_tree(lp, root, budget)
    assert out.tree.max_depth == depth and out.tree.longest_path == depth + 1
    node_depth = np.asarray(out.tree.depth)
    bonus = rng.integers(0, vocab, size=b)
    nxt = np.concatenate([spine, bonus[:, None]], 1)                    # the choice at depth d: spine[d]
    choice = np.take_along_axis(nxt, node_depth, 1).astype(np.int32)
    path, n, got_bonus = accept(out.tree, out.tokens, jnp.asarray(choice))
    np.testing.assert_array_equal(n, [depth + 1] * b)
    assert path.shape == (b, depth + 1)
    walked = np.take_along_axis(np.asarray(out.tokens), np.asarray(path), 1)
    np.testing.assert_array_equal(walked, np.concatenate([np.asarray(root)[:, None], spine], 1))
    np.testing.assert_array_equal(got_bonus, bonus)


def test_default_block_is_the_trained_one_and_ranges_are_named(pair):
    target, drafter = pair                                  # the drafter was trained with blocks of 6
    assert block_size_for(drafter.cfg, None) == 6
    for budget in (None, 5):
        spec = DFlash(drafter, target.cfg, budget=budget)
        assert spec.block_size == 6 and spec.tree_size == (6 if budget is None else budget + 1)
    for bs in (2, 6):
        assert DFlash(drafter, target.cfg, block_size=bs).block_size == bs
    for bs in (1, 7, 0, -2):
        with pytest.raises(ConfigError, match=rf"^--block-size {bs}: must be in \[2, 6\] \(the drafter was "
                                              rf"trained with blocks of 6\)$"):
            DFlash(drafter, target.cfg, block_size=bs)
    for budget in (0, -3):
        with pytest.raises(ConfigError, match=rf"^--budget {budget}: must be >= 1$"):
            DFlash(drafter, target.cfg, budget=budget)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.7, top_k=3)], ids=["greedy", "top3"])
def test_ddtree_proposal_is_the_best_tree_of_the_verified_distribution(pair, sampling):
    target, drafter = pair
    budget, bs = 10, 4
    rng = np.random.default_rng(33)
    spec = DFlash(drafter, target.cfg, block_size=bs, budget=budget)
    prompts = [rng.integers(0, 512, size=n).tolist() for n in (5, 9)]
    _, _, cache, _ = Engine(target, spec).prefill(prompts, 32)
    pending = jnp.asarray(rng.integers(0, 512, size=2), jnp.int32)
    prop, _ = spec.propose(nnx.state(drafter), target, cache, pending, jax.random.key(4), sampling)
    logits, _ = drafter.draft(cache, pending, target.embed_tokens[...], target.unembedding(), bs)  # [2, 3, V]
    logp = jax.nn.log_softmax(logits, -1) if sampling.greedy else log_probs(logits, sampling)
    want = build_tree(logp, pending, budget)
    assert prop.logq is None and prop.tree.max_depth == bs - 1
    np.testing.assert_array_equal(prop.tokens, want.tokens)
    np.testing.assert_array_equal(prop.tree.parent, want.tree.parent)
    np.testing.assert_array_equal(prop.tree.anc, want.tree.anc)
    tokens, depth = np.asarray(prop.tokens), np.asarray(prop.tree.depth)
    assert (tokens[:, 1:] >= 0).all()                       # all 10 nodes drafted (3 + 9 prefixes even at top-3)
    if sampling.top_k:                                      # only the 3 best tokens of each depth are drafted
        top = np.argsort(-np.asarray(logits), -1, kind="stable")[..., :3]
        for r in range(2):
            for j in range(1, budget + 1):
                assert tokens[r, j] in top[r, depth[r, j] - 1], (r, j)
