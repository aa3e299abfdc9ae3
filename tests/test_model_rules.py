"""Rules of the target model (jaxspec/model.py) that decoding relies on, on a tiny random model (fp32, CPU): a
batch's rows commit their own accepted tree paths independently (a row with n = 0 keeps its state), a verify of a
tree keeps the tree's mask whichever chain-attention op is forced, a one-token prefill piece commits on the general
GDN path even where the fused decode step is chosen, `logit_index` picks each row's node, padded vocabulary columns
are -inf, the committed state's shapes, dtypes and `max_len` (no limit without full-attention layers), and the
error that refuses commit_n on a tree names the way out."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import jitted
from jaxspec import tree as trees
from jaxspec.config import FULL, LINEAR, TargetConfig
from jaxspec.model import Qwen35, init_state


def config(**kw) -> TargetConfig:
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=48, layer_types=(LINEAR, FULL, LINEAR),
                num_heads=4, num_kv_heads=2, head_dim=16, rotary_dim=8, rope_theta=1e4, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, conv_kernel=4,
                dtype="float32")
    base.update(kw)
    return TargetConfig(**base)


def model(seed, **kw) -> Qwen35:
    return Qwen35(config(**kw), rngs=nnx.Rngs(seed))


def prefilled(m, fwd, com, rng, b, p):
    """A state of b rows, each having committed its own random prompt of p tokens."""
    state = init_state(m.cfg, b, 40)
    _, _, state, pend = fwd(jnp.asarray(rng.randint(0, m.cfg.vocab_size, (b, p))), state, trees.chain(b, p))
    path = jnp.broadcast_to(jnp.arange(p), (b, p))
    return com(state, pend, trees.chain(b, p), path, jnp.full((b,), p, jnp.int32))


def row(x, r):
    return jax.tree.map(lambda a: a[r:r + 1], x)


@pytest.mark.parametrize("max_depth", [None, 4])
def test_rows_commit_their_own_tree_paths(seed, max_depth):
    """One commit of a batch of trees, each row accepting a different path (one none at all), leaves every row the
    state that committing that row alone leaves; the row with n = 0 keeps its committed state. max_depth 4: the GDN
    update runs over the path's nodes only; None: over the last node's ancestors among all nodes."""
    m = model(seed)
    fwd, com = jitted(m)
    rng = np.random.RandomState(seed % 10000)
    b = 3
    base = prefilled(m, fwd, com, rng, b, 9)
    parent = np.array([-1, 0, 0, 1, 2, 4, 4, 5])
    tr = dataclasses.replace(trees.from_parents(jnp.asarray(np.broadcast_to(parent, (b, len(parent))))),
                             max_depth=max_depth)
    _, _, st, pend = fwd(jnp.asarray(rng.randint(0, m.cfg.vocab_size, (b, len(parent)))), base, tr)
    accepted = [[0, 2, 4, 6], [0, 1, 3], []]
    path = jnp.asarray([a + [0] * (len(parent) - len(a)) for a in accepted])[:, :tr.longest_path]
    n = jnp.asarray([len(a) for a in accepted], jnp.int32)
    got = com(st, pend, tr, path, n)
    np.testing.assert_array_equal(got.length, [9 + 4, 9 + 3, 9])
    for r in range(b):
        mine, alone = row(got, r), com(row(st, r), row(pend, r), row(tr, r), path[r:r + 1], n[r:r + 1])
        np.testing.assert_array_equal(mine.length, alone.length)
        for x, y in zip(mine.keys + mine.values + mine.conv + mine.ssm,
                        alone.keys + alone.values + alone.conv + alone.ssm):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    for x, y in zip(got.conv + got.ssm, base.conv + base.ssm):
        np.testing.assert_array_equal(x[2], y[2])                     # n = 0: the row keeps its state
        assert not np.allclose(x[0], y[0], atol=1e-4)                 # a row that accepted moved on
    for x, y in zip(got.keys + got.values, base.keys + base.values):
        np.testing.assert_array_equal(x[2, :9], y[2, :9])


def test_forced_chain_attention_leaves_trees_their_mask(seed, monkeypatch):
    """JAXSPEC_CHAIN_ATTENTION forces the op for chains only: a tree verified under it still sees its ancestors,
    not the causal mask of its node order (the same logits as without the flag), and a chain gets the same logits
    either way."""
    from pallas_kernels.chain_attention import api as chain_api
    m = model(seed)
    graphdef, params = nnx.split(m)
    rng = np.random.RandomState(seed % 10000)
    fwd0, com = jitted(m)
    base = prefilled(m, fwd0, com, rng, 2, 6)
    tr = trees.from_parents(jnp.asarray([[-1, 0, 0, 1, 2, 2, 0]] * 2))
    tokens = jnp.asarray(rng.randint(0, m.cfg.vocab_size, (2, 7)))
    ch = trees.chain(2, 7)
    out = {}
    for impl in (None, "reference"):
        if impl:
            monkeypatch.setenv(chain_api.ENV_VAR, impl)
        else:
            monkeypatch.delenv(chain_api.ENV_VAR, raising=False)
        fwd = jax.jit(lambda p, t, s, tr: nnx.merge(graphdef, p)(t, s, tr)[0])   # traced afresh: reads the flag
        out[impl] = fwd(params, tokens, base, tr), fwd(params, tokens, base, ch)
    np.testing.assert_allclose(out["reference"][0], out[None][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["reference"][1], out[None][1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(out[None][0], out[None][1], atol=1e-3)    # the tree's mask differs from the chain's


def test_one_token_prefill_piece_with_the_decode_kernel_forced(seed, monkeypatch):
    """A one-token chain forward with commit_n (a prefill piece of one token) commits through the general GDN path
    even where the fused one-token decode step is the dispatch's choice: the state of forward + commit."""
    from pallas_kernels.gdn_decode import api as decode_api
    m = model(seed)
    graphdef, params = nnx.split(m)
    fwd, com = jitted(m)
    rng = np.random.RandomState(seed % 10000)
    base = prefilled(m, fwd, com, rng, 2, 5)
    tokens = jnp.asarray(rng.randint(0, m.cfg.vocab_size, (2, 1)))
    tr, n = trees.chain(2, 1), jnp.asarray([1, 0], jnp.int32)
    logits, _, st, pend = fwd(tokens, base, tr)
    ref = com(st, pend, tr, jnp.zeros((2, 1), jnp.int32), n)
    monkeypatch.setenv(decode_api.ENV_VAR, "pallas_interpret")
    as_it_goes = jax.jit(lambda p, t, s, n: nnx.merge(graphdef, p)(t, s, tr, commit_n=n))
    got_logits, _, got, got_pend = as_it_goes(params, tokens, base, n)
    assert got_pend.gdn == ()
    np.testing.assert_array_equal(got.length, [6, 5])
    np.testing.assert_allclose(got_logits[0], logits[0], rtol=1e-5, atol=1e-5)
    for x, y in zip(got.conv + got.ssm, ref.conv + ref.ssm):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_logit_index_picks_each_rows_node(seed):
    """logits at `logit_index` [B] are row b's logits at node logit_index[b] (the last real token of a prefill
    piece), taken from the full forward's."""
    m = model(seed)
    graphdef, params = nnx.split(m)
    rng = np.random.RandomState(seed % 10000)
    tokens = jnp.asarray(rng.randint(0, m.cfg.vocab_size, (3, 10)))
    state, tr = init_state(m.cfg, 3, 16), trees.chain(3, 10)
    idx = jnp.asarray([4, 9, 0], jnp.int32)
    run = jax.jit(lambda p, i: nnx.merge(graphdef, p)(tokens, state, tr, logit_index=i)[0])
    full = jax.jit(lambda p: nnx.merge(graphdef, p)(tokens, state, tr)[0])(params)
    got = run(params, idx)
    assert got.shape == (3, m.cfg.vocab_size)
    for r, i in enumerate(np.asarray(idx)):
        np.testing.assert_allclose(got[r], full[r, i], rtol=1e-5, atol=1e-5)


def test_padded_vocabulary_columns_are_minus_inf(seed):
    """A vocabulary padded for tensor parallelism (padded_vocab > vocab_size) gives -inf logits at exactly the padding
    columns, so that no choice ever lands there; the real columns are finite."""
    m = model(seed, padded_vocab=100)
    fwd, _ = jitted(m)
    tokens = jnp.asarray(np.random.RandomState(seed % 10000).randint(0, 97, (2, 5)))
    logits, *_ = fwd(tokens, init_state(m.cfg, 2, 8), trees.chain(2, 5))
    assert logits.shape == (2, 5, 100)
    assert np.isfinite(np.asarray(logits[..., :97])).all()
    assert (np.asarray(logits[..., 97:]) == -np.inf).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_state_shapes_dtypes_and_max_len(dtype):
    """init_state: per full layer a K and a V cache of max_len slots in the model's dtype, per GDN layer the last
    K - 1 conv inputs in the model's dtype and the delta-rule state in fp32, lengths int32 zeros; max_len is the
    cache's slots, and without full-attention layers there is no limit."""
    cfg = config(dtype=dtype)
    st = init_state(cfg, 3, 37)
    assert st.max_len == 37
    assert st.length.dtype == jnp.int32 and st.length.tolist() == [0, 0, 0]
    assert [(k.shape, k.dtype) for k in st.keys + st.values] == [((3, 37, 2, 16), jnp.dtype(dtype))] * 2
    assert [(c.shape, c.dtype) for c in st.conv] == [((3, 3, cfg.conv_dim), jnp.dtype(dtype))] * 2
    assert [(s.shape, s.dtype) for s in st.ssm] == [((3, 4, 16, 16), jnp.float32)] * 2
    linear = init_state(config(dtype=dtype, layer_types=(LINEAR, LINEAR)), 2, 37)
    assert linear.keys == () and linear.max_len == 2**31 - 1


def test_commit_n_on_a_tree_is_refused_naming_commit(seed):
    """commit_n commits a chain as the forward goes; on a tree (whose path verification decides) it is refused, the
    error saying to use commit."""
    m = model(seed)
    tr = trees.from_parents(jnp.asarray([[-1, 0, 0]]))
    tokens = jnp.asarray(np.random.RandomState(seed % 10000).randint(1, 97, (1, 3)))
    with pytest.raises(ValueError, match=r"commit_n commits a chain.*\(use commit\)"):
        m(tokens, init_state(m.cfg, 1, 8), tr, commit_n=jnp.asarray([2]))
