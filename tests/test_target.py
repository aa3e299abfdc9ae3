"""The Flax target against Hugging Face transformers' Qwen3.5 (fp32, CPU): logits, taps, caching."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from conftest import jitted, make_causal_lm, make_conditional
from convert.hf import load_target
from jaxspec import tree as trees
from jaxspec.model import init_state

CONFIGS = {
    "default": {},
    # Non-default layer pattern, GQA 6:1, GDN value/key ratio 4, conv kernel 3, no partial rotary.
    "pattern": dict(layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention",
                                 "linear_attention"], num_hidden_layers=5, num_attention_heads=6,
                    num_key_value_heads=1, linear_num_key_heads=1, linear_num_value_heads=4,
                    linear_conv_kernel_dim=3,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0}),
    # Layer pattern from full_attention_interval only; head_dim 16, value heads = key heads.
    "interval": dict(num_hidden_layers=6, full_attention_interval=3, head_dim=16, linear_num_key_heads=3,
                     linear_num_value_heads=3, linear_key_head_dim=8, linear_value_head_dim=24),
}


def _forward_hf(model, ids):
    with torch.no_grad():
        out = model(torch.tensor(ids), output_hidden_states=True)
    return out.logits.numpy(), [h.numpy() for h in out.hidden_states]


def _rel(a, b):
    return float(np.abs(np.asarray(a) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_logits_and_taps(tmp_path, name):
    overrides = dict(CONFIGS[name])
    if name == "interval":
        # transformers fills layer_types itself; drop it from config.json to test the interval rule.
        hf = make_causal_lm(tmp_path, seed=1, **overrides)
        import json
        cfg = json.loads((tmp_path / "config.json").read_text())
        cfg.pop("layer_types", None)
        cfg["full_attention_interval"] = 3  # transformers consumes it into layer_types and drops it
        (tmp_path / "config.json").write_text(json.dumps(cfg))
    else:
        hf = make_causal_lm(tmp_path, seed=1, **overrides)
    model = load_target(tmp_path, dtype="float32")
    ids = np.random.RandomState(0).randint(0, 512, (2, 150))
    ref, hidden = _forward_hf(hf, ids)
    # Every layer, the last one included: HF's last hidden_states entry is taken after the final norm, and so is
    # the model's last tap (z-lab's drafters read hidden_states[i + 1]).
    taps = tuple(range(model.cfg.num_layers))
    fwd, _ = jitted(model)
    logits, tap, _, _ = fwd(jnp.asarray(ids), init_state(model.cfg, 2, 160), trees.chain(2, 150), taps=taps)
    assert _rel(logits, ref) < 1e-5
    for j, layer in enumerate(taps):  # tap i = output of decoder layer i = HF hidden_states[i + 1]
        assert _rel(tap[:, :, j], hidden[layer + 1]) < 1e-5


def _commit_chain(com, state, pend, n_tree, n):
    tr = trees.chain(state.length.shape[0], n_tree)
    path = jnp.broadcast_to(jnp.arange(n_tree), (state.length.shape[0], n_tree))
    return com(state, pend, tr, path, jnp.full(state.length.shape, n, jnp.int32))


def test_prefill_steps_and_chunks_reproduce_full_forward(tiny_hf):
    path, hf = tiny_hf
    model = load_target(path, dtype="float32")
    fwd, com = jitted(model)
    ids = np.random.RandomState(3).randint(0, 512, (1, 160))
    ref, _ = _forward_hf(hf, ids)
    tok = jnp.asarray(ids)
    state = init_state(model.cfg, 1, 192)
    # Prefill 70 (two delta-rule chunks), ten 1-token steps, one chunk of 40 committed only in part
    # (as a verify of which 7 tokens are accepted), then the rest as one chunk.
    logits, _, state, pend = fwd(tok[:, :70], state, trees.chain(1, 70))
    state = _commit_chain(com, state, pend, 70, 70)
    assert _rel(logits, ref[:, :70]) < 1e-5
    for t in range(70, 80):
        logits, _, state, pend = fwd(tok[:, t:t + 1], state, trees.chain(1, 1))
        state = _commit_chain(com, state, pend, 1, 1)
        assert _rel(logits[:, 0], ref[:, t]) < 1e-5
    logits, _, state, pend = fwd(tok[:, 80:120], state, trees.chain(1, 40))
    assert _rel(logits, ref[:, 80:120]) < 1e-5
    state = _commit_chain(com, state, pend, 40, 7)
    assert int(state.length[0]) == 87
    logits, _, state, pend = fwd(tok[:, 87:160], state, trees.chain(1, 73))
    assert _rel(logits, ref[:, 87:160]) < 1e-5


@pytest.mark.parametrize("sharded", [False, True])
def test_multimodal_checkpoint(tmp_path, sharded):
    hf = make_conditional(tmp_path, seed=2, max_shard_size="50KB" if sharded else None)
    assert (tmp_path / "model.safetensors.index.json").exists() == sharded
    model = load_target(tmp_path, dtype="float32")
    ids = np.random.RandomState(1).randint(0, 512, (1, 33))
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids), output_hidden_states=True)
    fwd, _ = jitted(model)
    logits, tap, _, _ = fwd(jnp.asarray(ids), init_state(model.cfg, 1, 40), trees.chain(1, 33), taps=(1,))
    assert _rel(logits, out.logits.numpy()) < 1e-5
    assert _rel(tap[:, :, 0], out.hidden_states[2].numpy()) < 1e-5


def test_tree_nodes_equal_their_ancestor_chains(tiny_hf):
    """Every node of a random tree gets the logits and taps of its root-to-node path run as a chain."""
    path, _ = tiny_hf
    model = load_target(path, dtype="float32")
    fwd, com = jitted(model)
    rng = np.random.RandomState(7)
    n = 12
    base = init_state(model.cfg, n, 64)
    prompt = jnp.asarray(np.broadcast_to(rng.randint(0, 512, (1, 21)), (n, 21)))
    _, _, base, pend = fwd(prompt, base, trees.chain(n, 21))
    base = _commit_chain(com, base, pend, 21, 21)
    parent = np.array([-1] + [rng.randint(0, i) for i in range(1, n)])
    tokens = rng.randint(0, 512, n)
    tr = trees.from_parents(jnp.asarray(np.broadcast_to(parent, (n, n))))
    logits, taps, _, _ = fwd(jnp.asarray(np.broadcast_to(tokens, (n, n))), base, tr, taps=(0, 3))
    # Row i of a batch runs node i's root-to-node path as a chain (zero-padded after its end).
    chains = np.zeros((n, n), np.int64)
    ends = np.zeros(n, np.int64)
    for i in range(n):
        chain = [i]
        while parent[chain[-1]] >= 0:
            chain.append(parent[chain[-1]])
        chain = chain[::-1]
        chains[i, :len(chain)] = tokens[chain]
        ends[i] = len(chain) - 1
        assert int(tr.depth[0, i]) == len(chain) - 1
    ref, ref_taps, _, _ = fwd(jnp.asarray(chains), base, trees.chain(n, n), taps=(0, 3))
    for i in range(n):
        np.testing.assert_allclose(logits[0, i], ref[i, ends[i]], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(taps[0, i], ref_taps[i, ends[i]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("max_depth, accepted", [(None, [0, 2, 4, 6]), (4, [0, 2, 4, 6]), (4, [0]), (None, [0, 2])])
def test_tree_commit_equals_chain_commit(tiny_hf, max_depth, accepted):
    """Committing an accepted path of a tree leaves the same state as committing that path as a chain, whether
    the GDN update runs over every node (max_depth unknown) or over the path's nodes alone (the tree's depth); with
    fewer accepted nodes than the conv's window (K - 1 = 3), the window reaches back into the committed history."""
    path, _ = tiny_hf
    model = load_target(path, dtype="float32")
    fwd, com = jitted(model)
    rng = np.random.RandomState(11)
    prompt = jnp.asarray(rng.randint(0, 512, (1, 9)))
    base = init_state(model.cfg, 1, 48)
    _, _, base, pend = fwd(prompt, base, trees.chain(1, 9))
    base = _commit_chain(com, base, pend, 9, 9)
    parent = np.array([-1, 0, 0, 1, 2, 4, 4, 5])
    tokens = rng.randint(0, 512, len(parent))
    tr = dataclasses.replace(trees.from_parents(jnp.asarray(parent[None])), max_depth=max_depth)
    assert int(tr.depth.max()) == 4
    _, _, st, pend = fwd(jnp.asarray(tokens[None]), base, tr)
    k = len(accepted)
    pth = jnp.asarray([accepted + [0] * (len(parent) - k)])[:, :tr.longest_path]   # as `accept` gives it
    st = com(st, pend, tr, pth, jnp.asarray([k]))
    _, _, ref, pend = fwd(jnp.asarray(tokens[accepted][None]), base, trees.chain(1, k))
    ref = _commit_chain(com, ref, pend, k, k)
    nxt = jnp.asarray([[5]])
    a, *_ = fwd(nxt, st, trees.chain(1, 1))
    b, *_ = fwd(nxt, ref, trees.chain(1, 1))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for x, y in zip(st.ssm + st.conv, ref.ssm + ref.conv):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    for x, y in zip(st.keys, ref.keys):
        np.testing.assert_allclose(x[:, :9 + k], y[:, :9 + k], rtol=1e-6, atol=1e-6)



# (150, 64): a row commits exactly one block, so its last token closes block 0 (commit reads that block's state).
@pytest.mark.parametrize("p, part, implementation", [(150, 70, None), (40, 23, None), (150, 70, "pallas_interpret"),
                                                     (150, 64, None)])
def test_forward_committing_as_it_goes_equals_commit(tiny_hf, p, part, implementation, monkeypatch):
    """A chain forward with commit_n (each GDN layer takes its committed state inside the delta rule, as the
    prefill runs) leaves the state that the forward then `commit` leaves, and the same logits at the committed
    tokens (to rounding: across blocks the two run different forms of the delta rule, chain.py's and a scan of tree
    blocks): across blocks of the chunked delta rule (150 tokens: 64 + 64 + 22) and in one block (40), for rows
    committing all of the piece, part of it (70: inside the second block) and none of it (a finished row keeps its
    state). With `implementation`, every delta rule runs that way ("pallas_interpret": the GPU's kernels
    interpreted)."""
    import jax
    from flax import nnx

    from jaxspec.model import commit

    from pallas_kernels.tree_delta_rule import ENV_VAR

    if implementation:
        monkeypatch.setenv(ENV_VAR, implementation)
    model = load_target(tiny_hf[0], dtype="float32")
    fwd, com = jitted(model)
    graphdef, params = nnx.split(model)
    rng = np.random.RandomState(5)
    b = 3
    base = init_state(model.cfg, b, 192)
    _, _, base, pend = fwd(jnp.asarray(rng.randint(0, 512, (b, 7))), base, trees.chain(b, 7))
    base = _commit_chain(com, base, pend, 7, 7)
    tokens = jnp.asarray(rng.randint(0, 512, (b, p)))
    tr, n = trees.chain(b, p), jnp.asarray([p, part, 0], jnp.int32)
    path = jnp.broadcast_to(jnp.arange(p), (b, p))

    logits, _, st, pend = fwd(tokens, base, tr)
    ref = com(st, pend, tr, path, n)

    @jax.jit
    def as_it_goes(params, tokens, state, n, tr):
        return nnx.merge(graphdef, params)(tokens, state, tr, commit_n=n)

    got_logits, _, got, got_pend = as_it_goes(params, tokens, base, n, tr)
    assert got_pend.gdn == ()
    np.testing.assert_array_equal(got.length, [7 + p, 7 + part, 7])
    np.testing.assert_array_equal(got.length, ref.length)
    for row, real in enumerate(np.asarray(n)):        # past commit_n a row's tokens are padding (made inert)
        np.testing.assert_allclose(got_logits[row, :real], logits[row, :real], rtol=1e-6, atol=1e-6)
    for x, y in zip(got.keys + got.values, ref.keys + ref.values):
        for row, length in enumerate(np.asarray(got.length)):     # cache rows past a row's length are free slots
            np.testing.assert_allclose(x[row, :length], y[row, :length], rtol=1e-5, atol=1e-5)
    for x, y in zip(got.conv, ref.conv):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)
    for x, y, s0 in zip(got.ssm, ref.ssm, base.ssm):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(x[2], s0[2])               # the row that commits nothing
        assert not np.allclose(x[1], s0[1], atol=1e-3)           # the partial row moved on
    with pytest.raises(ValueError, match="chain"):
        model(tokens[:, :4], base, trees.from_parents(jnp.asarray([[-1, 0, 0, 1]] * b)), commit_n=n)

def test_tree_commit_moves_kv_rows_in_place(tiny_hf):
    """A tree's commit moves the accepted rows of each full-attention layer's cache in place: compiled with the
    state donated, it copies no cache-sized buffer (a copy would cost a pass over every layer's whole cache in
    each DDTree round). The move gathers rows from the cache and scatters them back into it. Passed on an H100
    too (JAX_PLATFORMS=cuda, -m "gpu or not gpu"; session 58), where no copy was found in the round loop either."""
    import functools
    import re

    import jax

    from jaxspec.model import commit

    model = load_target(tiny_hf[0], dtype="float32")
    fwd, _ = jitted(model)
    slots = 4099                     # a length no other buffer has
    parent = jnp.asarray([[-1, 0, 0, 1, 2, 4, 4, 5]])
    tr = trees.from_parents(parent)
    _, _, st, pend = fwd(jnp.arange(8)[None], init_state(model.cfg, 1, slots), tr)
    path = jnp.asarray([[0, 2, 4, 6, 0][:tr.longest_path]])
    com = jax.jit(functools.partial(commit, tree=tr), donate_argnums=(0,))
    text = com.lower(st, pend, path=path, n=jnp.asarray([4])).compile().as_text()
    copies = [ln for ln in text.splitlines() if re.search(rf"\b{slots}\b[^=]*\b(copy|copy-start)\(", ln)]
    assert any(re.search(rf"\b{slots}\b.*scatter", ln) for ln in text.splitlines())     # the move is compiled
    assert not copies, "\n".join(copies[:4])

def test_norm_scale_after_the_product(tmp_path):
    """RMSNorm.deferred leaves the 1 / rms scale for after the product: (x * (1 + w)) @ W * r = norm(x) @ W, and the
    target built on it gives transformers' logits."""
    hf = make_causal_lm(tmp_path, seed=2)
    model = load_target(tmp_path, dtype="float32")
    x = jnp.asarray(np.random.RandomState(1).randn(3, 5, model.cfg.hidden_size), jnp.float32)
    norm = model.layers[0].input_layernorm
    h, r = norm.deferred(x)
    assert r.shape == (3, 5, 1)
    w = np.random.RandomState(2).randn(model.cfg.hidden_size, 7)
    np.testing.assert_allclose(np.asarray(h @ w * r), np.asarray(norm(x) @ w), rtol=1e-4, atol=1e-4)
    assert not np.allclose(np.asarray(h), np.asarray(norm(x)), atol=1e-3)   # the scale really moved
    ids = np.random.RandomState(3).randint(0, 512, (2, 40))
    ref, _ = _forward_hf(hf, ids)
    logits, _, _, _ = model(jnp.asarray(ids), init_state(model.cfg, 2, 48), trees.chain(2, 40))
    assert _rel(logits, ref) < 1e-5
