"""Sampling's top-k / top-p edges, the tree structures' invariants and the MTP speculator's sampled drafts, each
against a direct numpy statement of its definition (transformers' top-p rule: keep the fewest largest tokens whose
mass reaches top_p). Written from a mutation review of jaxspec/sampling.py, jaxspec/tree.py and jaxspec/mtp.py:
each test fails on one mutant of that code, named in it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.sampling import Sampling, choose, log_probs

# Probabilities whose float32 logs exponentiate back exactly (checked below), so that the mass above token 2 is
# exactly 0.75: the top-p boundary itself, where `<` and `<=` part.
DYADIC = np.asarray([0.5, 0.25, 0.125, 0.125])


def top_p_oracle(p: np.ndarray, top_p: float) -> np.ndarray:
    """Kept mask by the definition: a token stays iff the mass strictly above its value is < top_p."""
    return np.asarray([p[p > v].sum() < top_p for v in p])


@pytest.mark.parametrize("s", [Sampling(1.0, top_p=0.75), Sampling(1.0, 4, 0.75)], ids=["searched", "top_k_then_top_p"])
def test_top_p_drops_the_token_whose_mass_above_equals_top_p(s):
    """Mass above token 2 is exactly top_p = 0.75: the first two tokens already reach it, so only they stay (the
    searched cut for top-p alone, nucleus_cut after a top-k). `<=` in either comparison keeps all four."""
    logits = jnp.log(jnp.asarray(DYADIC, jnp.float32))[None]
    e = np.asarray(jnp.exp(logits - logits.max()))[0]        # the masses the cut sums, relative to the top one
    assert e.tolist() == (DYADIC * 2).tolist(), f"this backend's exp is not exact here, the boundary moved: {e}"
    want = top_p_oracle(DYADIC, 0.75)
    assert want.tolist() == [True, True, False, False]
    kept = np.isfinite(np.asarray(log_probs(logits, s)))[0]
    np.testing.assert_array_equal(kept, want)


@pytest.mark.parametrize("s", [Sampling(1.0, 2), Sampling(0.5, 3)], ids=str)
def test_choose_with_top_k_alone_draws_only_the_k_largest(s):
    """choose() with top-k and no top-p (a path of its own beside temperature-only sampling): 20000 seeded draws
    never leave the k largest tokens, and follow softmax(logits / T) renormalised over them within 5 binomial
    standard deviations per token (false-failure probability < 1e-5 per setting, by a union bound over tokens)."""
    p = np.asarray([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    n = 20000
    draws = np.asarray(choose(jax.random.key(5), jnp.broadcast_to(jnp.log(jnp.asarray(p, jnp.float32)), (n, 6)), s))
    want = p ** (1.0 / s.temperature)
    want[s.top_k:] = 0.0
    want /= want.sum()
    freq = np.bincount(draws, minlength=6) / n
    assert (freq[s.top_k:] == 0).all(), freq
    assert (np.abs(freq - want) <= 5 * np.sqrt(want * (1 - want) / n) + 1e-12).all(), (freq, want)


# ------------------------------------------------------------------------------------------------
# MTP drafts: the tiny checkpoint of tests/test_mtp.py (random weights), propose run eagerly.


@pytest.fixture(scope="module")
def mtp_spec(tmp_path_factory):
    from conftest import make_causal_lm
    from convert.mtp import load_mtp
    from jaxspec.mtp import MTP
    from test_mtp import with_mtp
    path = tmp_path_factory.mktemp("mtp_gaps")
    target, _ = with_mtp(path, make_causal_lm, 21)
    return target, MTP(load_mtp(path, target.cfg, "float32"), target.cfg, 3)


def _propose(target, spec, s, key, rows=16):
    cache = spec.init(rows, 32)
    pending = jnp.arange(rows, dtype=jnp.int32) % target.cfg.vocab_size
    return spec.propose(spec.params, target, cache, pending, key, s)[0]


def test_mtp_sampled_drafts_lie_in_the_support_of_their_reported_q(mtp_spec):
    """Rejection sampling is lossless only if each draft m_j is drawn from the q_j that propose reports. With top_k
    = 1 that q_j is one token: every draft of 16 rows x 3 depths must be it (log q = 0), i.e. the argmax of its
    row of q. (Drawing m_j from the untransformed head logits instead puts drafts outside q's support.)"""
    target, spec = mtp_spec
    prop = _propose(target, spec, Sampling(1.0, 1), jax.random.key(0))
    toks, logq = np.asarray(prop.tokens), np.asarray(prop.logq)
    assert logq.shape[:2] == toks.shape == (16, 4)
    picked = np.take_along_axis(logq[:, 1:], toks[:, 1:, None], -1)[..., 0]
    np.testing.assert_array_equal(picked, 0.0)
    np.testing.assert_array_equal(toks[:, 1:], logq[:, 1:].argmax(-1))


def test_mtp_draws_each_depth_with_its_own_key(mtp_spec, monkeypatch):
    """The k draft depths draw with k distinct keys, none of them the round's key itself: reusing one key makes
    the depths' Gumbel noise identical, so m2 is no longer drawn from q2 independently of m1 (not lossless)."""
    import jaxspec.mtp as mtp
    target, spec = mtp_spec
    seen = []
    real = mtp.categorical
    monkeypatch.setattr(mtp, "categorical", lambda k, x: seen.append(np.asarray(jax.random.key_data(k))) or real(k, x))
    key = jax.random.key(4)
    _propose(target, spec, Sampling(1.0), key, rows=2)
    data = {d.tobytes() for d in seen}
    assert len(seen) == spec.k and len(data) == spec.k, len(data)
    assert np.asarray(jax.random.key_data(key)).tobytes() not in data


# ------------------------------------------------------------------------------------------------
# Trees against a numpy oracle of their definitions


def tree_oracle(parent: np.ndarray):
    """depth and ancestor-or-self mask of one row of parents, by walking up to the root."""
    n = len(parent)
    depth, anc = np.zeros(n, np.int32), np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j] = True
            depth[i] += j != i
            j = parent[j]
    return depth, anc


@pytest.mark.parametrize("n", [1, 2, 5])
def test_chain_is_a_chain_for_every_size(n):
    """trees.chain: parent i - 1, depth i, lower-triangular ancestors, and the static chain flag set, N = 1
    included (a one-node tree satisfies "node i's parent is i - 1 for every i"; AR verifies exactly that tree)."""
    from jaxspec import tree as trees
    t = trees.chain(3, n)
    parent = np.arange(n) - 1
    depth, anc = tree_oracle(parent)
    assert t.chain is True and t.size == n and t.longest_path == n
    np.testing.assert_array_equal(np.asarray(t.parent), np.broadcast_to(parent, (3, n)))
    np.testing.assert_array_equal(np.asarray(t.depth), np.broadcast_to(depth, (3, n)))
    np.testing.assert_array_equal(np.asarray(t.anc), np.broadcast_to(anc, (3, n, n)))


def test_longest_path_counts_the_root():
    """A tree known to be at most d deep has paths of d + 1 nodes (capped at N); unknown depth means N."""
    from jaxspec import tree as trees
    t = trees.from_parents(jnp.asarray([[-1, 0, 0, 1, 3]]))
    assert t.longest_path == 5 and trees.forest(1, 4).longest_path == 1
    assert [trees.Tree(t.parent, t.depth, t.anc, max_depth=d).longest_path for d in (0, 2, 3, 4, 9)] == [1, 3, 4, 5, 5]
