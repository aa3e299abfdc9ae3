"""DDTree on the one engine: the real drafter's trees token-identical to AR, edge cases (B = 1, B
beyond the number of possible nodes, vocab < B, stop token inside an accepted path, context nearly
full), the chain-shaped tree equal to the DFlash verify bit for bit, and the sampled distribution."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import jitted, make_causal_lm
from convert.hf import load_target
from jaxspec import tree as trees
from jaxspec.dflash import DFlash
from jaxspec.drafter import Drafter
from jaxspec.engine import Engine
from jaxspec.model import init_state
from jaxspec.sampling import Sampling
from oracle import OracleTree, reference
from test_dflash import accepting_pair, drafter_config  # noqa: F401 (accepting_pair: a fixture)
from test_lossless import _chi2_exceeds


@pytest.fixture(scope="module")
def pair(tiny_hf):
    target = load_target(tiny_hf[0], dtype="float32")
    return target, Drafter(drafter_config(), rngs=nnx.Rngs(3))


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab6")
    make_causal_lm(path, seed=9, vocab_size=6)
    target = load_target(path, dtype="float32")
    target.lm_head.kernel.set_value(target.lm_head.kernel[...] * 12.0)   # sharpen near-uniform logits
    drafter = Drafter(drafter_config(vocab_size=6, mask_token_id=5, block_size=3), rngs=nnx.Rngs(4))
    return target, drafter


@pytest.mark.parametrize("which", ["pair", "accepting_pair"])
@pytest.mark.parametrize("budget", [1, 7, 30])
def test_real_drafter_trees_equal_ar(which, budget, request):
    """The real (random) drafter's trees: the same tokens as AR; with `accepting_pair` (the target choosing among 3
    tokens) where the trees' drafted tokens are accepted."""
    target, drafter = request.getfixturevalue(which)
    rs = np.random.RandomState(budget)
    prompts = [rs.randint(0, 512, size=n).tolist() for n in (5, 23, 47)]
    ar = Engine(target).generate(prompts, 25).tokens
    out = Engine(target, DFlash(drafter, target.cfg, budget=budget)).generate(prompts, 25, rounds_per_call=4)
    assert out.tokens == ar
    if which == "accepting_pair" and budget > 1:
        assert out.tau > 1.1, (budget, out.tau)      # 1.38 at B = 7, 1.76 at 30 on this CPU


class RecordedDFlash(DFlash):
    """DFlash whose every proposed tree (tokens, parents) is handed to the host, in round order."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.trees = []

    def propose(self, params, model, cache, pending, key, sampling):
        prop, cache = super().propose(params, model, cache, pending, key, sampling)
        jax.debug.callback(lambda t, p: self.trees.append((np.asarray(t), np.asarray(p))),
                           prop.tokens, prop.tree.parent, ordered=True)
        return prop, cache


def test_trees_selected_by_counting_equal_ar(accepting_pair, monkeypatch):
    """The sort-free tree build (JAXSPEC_DDTREE_TOP_K=count, read when the round is traced) in the engine, with
    `accepting_pair` (drafted tokens accepted; 510 of its 512 logits tie at 0, so the stable tie order counts):
    the same trees node for node as lax.top_k's build, so the same acceptance histogram, and the same tokens
    as AR."""
    target, drafter = accepting_pair
    rs = np.random.RandomState(5)
    prompts = [rs.randint(0, 512, size=n).tolist() for n in (9, 31)]
    ar = Engine(target).generate(prompts, 25).tokens
    from jaxspec import ddtree
    counted = []
    rank = ddtree.count_ranks
    monkeypatch.setattr(ddtree, "count_ranks", lambda x: counted.append(x.shape) or rank(x))
    runs = {}
    for method in ("sort", "count"):
        monkeypatch.setenv("JAXSPEC_DDTREE_TOP_K", method)
        jax.clear_caches()
        try:
            spec = RecordedDFlash(drafter, target.cfg, budget=30)
            out = Engine(target, spec).generate(prompts, 25, rounds_per_call=4)
        finally:
            monkeypatch.delenv("JAXSPEC_DDTREE_TOP_K")
            jax.clear_caches()
        assert out.tokens == ar, method
        runs[method] = out, spec.trees
        if method == "sort":
            assert not counted, counted
    assert len(counted) >= 3, counted          # the vocabulary, the beams and the final pick were counted
    (by_sort, sort_trees), (by_count, count_trees) = runs["sort"], runs["count"]
    np.testing.assert_array_equal(by_count.hist, by_sort.hist)
    assert by_sort.tau > 1.5, by_sort.tau      # 2.00 on this CPU: the trees' drafts are accepted
    assert len(count_trees) == len(sort_trees) > 0
    for i, ((t_s, p_s), (t_c, p_c)) in enumerate(zip(sort_trees, count_trees)):
        np.testing.assert_array_equal(t_c, t_s, err_msg=f"round {i}: tokens")
        np.testing.assert_array_equal(p_c, p_s, err_msg=f"round {i}: parents")


def test_budget_beyond_possible_nodes_and_vocab_below_budget(small_vocab):
    """Vocab 6, depth 2: only 6 + 36 = 42 prefixes exist; budget 60 leaves invalid nodes in the tree."""
    target, drafter = small_vocab
    prompts = [[1, 2, 3], [4, 0, 2, 2, 1]]
    ar = Engine(target).generate(prompts, 30).tokens
    out = Engine(target, DFlash(drafter, target.cfg, budget=60)).generate(prompts, 30)
    assert out.tokens == ar
    # With every prefix of depth <= 2 in the tree, the greedy continuation is always found: each round emits 3
    # tokens, but the last of each sequence, which max_new cuts to 2 (prefill gives 1, then 9 x 3 + 2 = 29).
    assert out.hist[:4].tolist() == [0, 0, 2, 18] and out.hist[4:].sum() == 0, out.hist


def test_stop_token_inside_an_accepted_path(tiny_hf):
    target = load_target(tiny_hf[0], dtype="float32")
    prompts = [[7, 8, 9, 10], [300, 1, 2]]
    free = Engine(target).generate(prompts, 40).tokens
    stop = free[0][17]
    ar = Engine(target, stop_tokens=[stop]).generate(prompts, 40).tokens
    spec = Engine(target, OracleTree(6, 20, 512, reference(prompts, free, 8)), stop_tokens=[stop])
    out = spec.generate(prompts, 40, seed=3)
    assert out.tokens == ar and ar[0][-1] == stop and len(ar[0]) == 18
    assert out.tau > 1.5     # several tokens per round, so the stop token sat inside accepted paths
    # The histogram counts the tokens each round emitted (none past the stop token or max_new), not the accepted
    # path's length: over the rounds they add up to every token but prefill's.
    assert (out.hist * np.arange(len(out.hist))).sum() == out.n_tokens - len(prompts), out.hist


def test_context_nearly_full(tiny_hf):
    target = load_target(tiny_hf[0], dtype="float32")
    prompt = list(range(1, 30))
    budget, n_new = 12, 20
    free = Engine(target).generate([prompt], n_new).tokens
    spec = Engine(target, OracleTree(5, budget, 512, reference([prompt], free, 8)))
    need = len(prompt) + n_new + budget + 1
    assert spec.generate([prompt], n_new, max_len=need).tokens == free
    with pytest.raises(ValueError, match="exceeds the context"):
        spec.generate([prompt], n_new, max_len=need - 1)


def test_chain_shaped_tree_is_the_dflash_verify_bit_for_bit(tiny_hf):
    target = load_target(tiny_hf[0], dtype="float32")
    fwd, com = jitted(target)
    n = 16
    state = init_state(target.cfg, 1, 64)
    toks = jnp.asarray(np.random.RandomState(0).randint(0, 512, (1, 21)))
    _, _, state, pend = fwd(toks, state, trees.chain(1, 21))
    state = com(state, pend, trees.chain(1, 21), jnp.arange(21)[None], jnp.array([21]))
    block = jnp.asarray(np.random.RandomState(1).randint(0, 512, (1, n)))
    as_chain = trees.chain(1, n)
    as_tree = trees.from_parents(as_chain.parent)
    assert not as_tree.chain
    a = fwd(block, state, as_chain, taps=(1, 2))
    b = fwd(block, state, as_tree, taps=(1, 2))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize("budget", [None, 6], ids=["chain", "tree"])
def test_real_drafter_sampled_matches_ar_distribution(small_vocab, budget):
    """The real drafter's own draft distribution (its logits through the sampling warp, not an oracle's logq):
    sampled DFlash chains and DDTree trees give AR's output distribution, with drafts accepted. A hot temperature
    and a tight top-k make the warp change the drafter's distribution a lot: a chain whose logq came from the unwarped
    logits fails here (checked by mutation; at T 1.2, top-k 5 it passed)."""
    target, drafter = small_vocab
    rows = 3000
    s = Sampling(temperature=2.0, top_k=3)
    prompts = [[1, 2, 3, 4]] * rows
    ar = Engine(target, sampling=s).generate(prompts, 3, seed=0).tokens
    sp = Engine(target, DFlash(drafter, target.cfg, budget=budget), sampling=s).generate(prompts, 3, seed=1)
    assert not _chi2_exceeds(ar, sp.tokens, 6)
    assert sp.tau > 1.1, sp.tau


def test_sampled_trees_match_ar_distribution(small_vocab):
    """Independent per-node target samples walked through oracle trees: the output distribution is AR's."""
    target, _ = small_vocab
    rows = 3000
    s = Sampling(temperature=1.2, top_k=5)
    prompts = [[1, 2, 3, 4]] * rows
    ar = Engine(target, sampling=s).generate(prompts, 3, seed=0).tokens
    guess = np.random.RandomState(0).randint(0, 6, (rows, 16)).astype(np.int32)
    sp = Engine(target, OracleTree(3, 10, 6, guess), sampling=s).generate(prompts, 3, seed=1)
    assert not _chi2_exceeds(ar, sp.tokens, 6)
    assert sp.tau > 1.2
