"""DFlash with the real drafter module on the one engine: greedy output identical to AR, the
drafter's context after several rounds equal to a context built from scratch, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from convert.hf import load_target
from jaxspec import tree as trees
from jaxspec.config import ConfigError
from jaxspec.dflash import DFlash
from jaxspec.drafter import Drafter
from jaxspec.drafter_config import DrafterConfig
from jaxspec.engine import Engine
from jaxspec.sampling import Sampling


def drafter_config(**kw):
    base = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2, head_dim=16,
                layer_types=("sliding_attention", "full_attention"), rope_theta=1e7, target_layer_ids=(0, 2),
                mask_token_id=500, block_size=6, sliding_window=8, dtype="float32")
    return DrafterConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def pair(tiny_hf):
    target = load_target(tiny_hf[0], dtype="float32")
    return target, Drafter(drafter_config(), rngs=nnx.Rngs(3))


@pytest.fixture(scope="module")
def accepting_pair(pair):
    """`pair` with the target's lm_head cut to 2 of its 512 columns (every other logit 0): target and drafter, which
    shares the lm_head, then choose among 3 tokens, so rounds accept drafted tokens (a random drafter over the
    whole vocabulary almost never is)."""
    full, drafter = pair
    assert not full.cfg.tie_word_embeddings
    target = nnx.clone(full)
    target.lm_head.kernel.value = target.lm_head.kernel.value.at[:, 2:].set(0.0)
    return target, drafter


@pytest.mark.parametrize("which", ["pair", "accepting_pair"])
def test_greedy_dflash_equals_ar(which, request):
    target, drafter = request.getfixturevalue(which)
    rs = np.random.RandomState(0)
    prompts = [rs.randint(0, 512, size=n).tolist() for n in (4, 19, 40)]   # 19, 40 > the window of 8
    ar = Engine(target).generate(prompts, 30).tokens
    for bs in (2, 6):
        out = Engine(target, DFlash(drafter, target.cfg, block_size=bs)).generate(prompts, 30, rounds_per_call=3)
        assert out.tokens == ar
        if which == "accepting_pair":           # the identity holds where drafted tokens are accepted
            assert out.tau > 1.1, (bs, out.tau)     # 1.26 at block 2, 1.33 at 6 on this CPU


@pytest.mark.parametrize("budget", [None, 6], ids=["dflash", "ddtree6"])
def test_drafter_context_tracks_committed_sequence(accepting_pair, budget, tiny_hf):
    """After prefill and rounds, the drafter's context equals the one built in one go from transformers' hidden states
    of the whole committed sequence, hidden_states[i + 1] for the config's target_layer_ids in their order (as z-lab's
    reference extracts them): proof that the accepted rows' taps feed it correctly (with a pair whose rounds accept
    drafted tokens: a round of one accepted row would not test the rows' order). For DDTree the accepted path is not
    the first nodes, so the taps must be taken along it."""
    import torch
    target, drafter = accepting_pair
    spec = DFlash(drafter, target.cfg, block_size=4, budget=budget)
    engine = Engine(target, spec)
    prompt = np.random.RandomState(1).randint(0, 512, size=13).tolist()
    first, state, cache, key = engine.prefill([prompt], 64)
    from jaxspec.engine import Decoding
    b = 1
    d = Decoding(state, cache, first, jnp.zeros((b, 40), jnp.int32).at[:, 0].set(first), jnp.ones((b,), jnp.int32),
                 jnp.zeros((b,), bool), key, jnp.zeros((b, 5), jnp.int32), jnp.zeros((b,), jnp.int32))
    d = engine._run(engine.params, d, 30, 6)
    assert np.asarray(d.hist)[0, 2:].sum() > 0, np.asarray(d.hist)     # some round accepted a drafted token
    n = int(d.state.length[0])
    seq = prompt + np.asarray(d.out[0, :int(d.n_out[0])]).tolist()
    assert len(seq) == n + 1                 # everything but the pending token is committed
    with torch.no_grad():     # taps are the layers' outputs, before the lm_head that accepting_pair cuts
        hidden = tiny_hf[1](torch.tensor([seq[:n]]), output_hidden_states=True).hidden_states
    taps = np.stack([hidden[i + 1][0].numpy() for i in drafter.cfg.target_layer_ids], 1)[None]
    ref = drafter.add_context(drafter.init_cache(1, 64), jnp.asarray(taps, jnp.float32), jnp.asarray([n]))
    assert int(d.draft.length[0]) == n
    # A full layer's rows past the context are scratch (the last drafted block's K/V); a ring is all context.
    rows = [n if w is None else None for w in drafter.cfg.windows] * 2
    for got, want, r in zip(d.draft.keys + d.draft.values, ref.keys + ref.values, rows):
        np.testing.assert_allclose(got[:, :r], want[:, :r], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("top_k", [0, 1])
def test_sampled_chain_carries_each_drafts_own_distribution(pair, top_k):
    """A sampled DFlash proposal's logq row j is the distribution node j was drawn from: row 0 (the anchor, not drawn)
    all zero, row j >= 1 the drafter's sampling distribution at block slot j (`log_probs` of its logits), and each
    draft has finite mass under its own row (with top_k = 1, all of it). Rejection sampling divides by these rows."""
    from jaxspec.sampling import log_probs
    target, drafter = pair
    spec = DFlash(drafter, target.cfg, block_size=5)
    s = Sampling(temperature=0.8, top_k=top_k)
    prompts = [[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7]]
    _, _, cache, _ = Engine(target, spec).prefill(prompts, 32)
    pending = jnp.array([11, 42], jnp.int32)
    params = nnx.state(drafter)
    prop, _ = spec.propose(params, target, cache, pending, jax.random.key(3), s)
    logits, _ = drafter.draft(cache, pending, target.embed_tokens[...], target.unembedding(), 5)
    want = np.asarray(log_probs(logits, s))
    logq, tokens = np.asarray(prop.logq), np.asarray(prop.tokens)
    assert logq.shape == (2, 5, 512) and np.all(logq[:, 0] == 0) and np.all(tokens[:, 0] == [11, 42])
    np.testing.assert_allclose(logq[:, 1:], want, rtol=1e-6, atol=1e-6)
    own = np.take_along_axis(logq[:, 1:], tokens[:, 1:, None], 2)[..., 0]
    assert np.all(np.isfinite(own))
    if top_k == 1:
        np.testing.assert_array_equal(own, 0.0)
        np.testing.assert_array_equal(tokens[:, 1:], np.argmax(want, -1))


def test_sampled_dflash_runs_and_is_seeded(pair):
    target, drafter = pair
    eng = Engine(target, DFlash(drafter, target.cfg), sampling=Sampling(temperature=0.9, top_k=40))
    a = eng.generate([[1, 2, 3]], 12, seed=4).tokens
    assert a == eng.generate([[1, 2, 3]], 12, seed=4).tokens and len(a[0]) == 12
    assert a != eng.generate([[1, 2, 3]], 12, seed=5).tokens and all(0 <= t < 512 for t in a[0])


def test_bad_pairs_and_block_sizes(pair):
    target, drafter = pair
    with pytest.raises(ConfigError, match="block-size"):
        DFlash(drafter, target.cfg, block_size=7)
    with pytest.raises(ConfigError, match="block-size"):
        DFlash(drafter, target.cfg, block_size=1)
    with pytest.raises(ConfigError, match="hidden"):
        DFlash(Drafter(drafter_config(hidden_size=32), rngs=nnx.Rngs(0)), target.cfg)
    wide = Drafter(drafter_config(target_layer_ids=(0, 4)), rngs=nnx.Rngs(0))
    with pytest.raises(ConfigError, match=r"ids \[4\] are not layers of"):
        DFlash(wide, target.cfg)
    # a tree of more nodes than the target's whole context: refused (a sanity cap), naming the flag
    bound = target.cfg.max_position_embeddings
    assert bound > 1
    with pytest.raises(ConfigError, match=rf"--budget {bound}: a tree of {bound + 1} nodes is more than the "
                                          rf"target's whole context \(max_position_embeddings {bound}\)"):
        DFlash(drafter, target.cfg, budget=bound)
    assert DFlash(drafter, target.cfg, budget=bound - 1).tree_size == bound
    assert DFlash(drafter, target.cfg.replace(max_position_embeddings=0), budget=bound).tree_size == bound + 1
    with pytest.raises(ConfigError, match=r"mask_token_id 512 is outside the vocabulary \[0, 512\)"):
        drafter_config(mask_token_id=512)   # the drafter's own vocabulary (DFlash equates it with the target's)
