"""The checkpoint's MTP head as a speculator: its forward, recursive drafts and KV cache against a float64
numpy transcription of the formula (reference/qwen36.md section 3.8); greedy output identical to AR with
the real head and with an oracle that makes every acceptance length occur; the sampled output
distribution; weights from the converter and every way the input can be bad."""

from __future__ import annotations

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from conftest import jitted, make_causal_lm, make_conditional
from convert.hf import CheckpointError, load_target
from convert.mtp import load_mtp, mtp_layout
from jaxspec import tree as trees
from jaxspec.config import ConfigError
from jaxspec.engine import Decoding, Engine, Proposal
from jaxspec.generate import main
from jaxspec.model import init_state, split_params
from jaxspec.mtp import MTP, MTPCache, MTPHead
from jaxspec.sampling import Sampling
from test_convert import add_mtp, fake_mtp, read_file, rewrite
from test_lossless import _chi2_exceeds

# ------------------------------------------------------------------------------------------------
# Checkpoints with an MTP head


def mtp_weights(cfg, seed):
    """Random `mtp.*` tensors (HF layout, fp32) for a target `cfg`. Linear weights ~ 1.5/sqrt(fan_in), so
    that attention is neither flat nor one-hot; norm offsets ~ N(0, 0.3), so that a wrong (1 + w)
    convention shows."""
    rng = np.random.default_rng(seed)
    out = {}
    for key, (_, shape, _) in mtp_layout(cfg).items():
        if len(shape) == 1:
            out[key] = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        else:
            out[key] = (rng.standard_normal(shape) * 1.5 / np.sqrt(shape[1])).astype(np.float32)
    return out


def with_mtp(path, make, seed, **overrides):
    make(path, seed=seed, **overrides)
    target = load_target(path, dtype="float32")
    w = mtp_weights(target.cfg, seed + 100)
    add_mtp(path, w)
    return target, w


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    """The default tiny hybrid target (3 GDN + 1 attention layers), flat keys, one file."""
    path = tmp_path_factory.mktemp("mtp_causal")
    target, w = with_mtp(path, make_causal_lm, 11)
    return path, target, w


@pytest.fixture(scope="module")
def cond(tmp_path_factory):
    """The multimodal layout, sharded, 6 layers (the last one GDN, so h_t comes from a GDN tap)."""
    path = tmp_path_factory.mktemp("mtp_cond")
    target, w = with_mtp(path, lambda p, seed: make_conditional(p, seed=seed, max_shard_size="50KB",
                                                                 num_hidden_layers=6), 12)
    return path, target, w


# ------------------------------------------------------------------------------------------------
# The formula, transcribed in float64 numpy (independent of jaxspec's modules)


def rms(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1.0 + w)


def rope(x, pos, rot, theta):
    """rotate_half RoPE on the first `rot` dims; x [T, H, hd], pos [T]."""
    inv = 1.0 / theta ** (np.arange(0, rot, 2) / rot)
    f = pos[:, None].astype(np.float64) * inv
    cos, sin = np.cos(np.concatenate([f, f], -1))[:, None], np.sin(np.concatenate([f, f], -1))[:, None]
    xr, half = x[..., :rot], rot // 2
    turned = np.concatenate([-xr[..., half:], xr[..., :half]], -1)
    return np.concatenate([xr * cos + turned * sin, x[..., rot:]], -1)


def mtp_rows(w, cfg, emb, hid, pos):
    """The head over T rows: emb [T, D] = embed(token_{t+1}), hid [T, D] = h_t, RoPE positions pos [T];
    row t attends to rows 0..t. Returns (o after mtp.norm, x before it, K, V)."""
    g = lambda k: w["mtp." + k].astype(np.float64)
    t, nh, kvh, hd = len(emb), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    x = np.concatenate([rms(emb, g("pre_fc_norm_embedding.weight")), rms(hid, g("pre_fc_norm_hidden.weight"))],
                       -1) @ g("fc.weight").T
    a = rms(x, g("layers.0.input_layernorm.weight"))
    qg = (a @ g("layers.0.self_attn.q_proj.weight").T).reshape(t, nh, 2 * hd)   # per head: query, then gate
    q, gate = qg[..., :hd], qg[..., hd:].reshape(t, nh * hd)
    q = rope(rms(q, g("layers.0.self_attn.q_norm.weight")), pos, cfg.rotary_dim, cfg.rope_theta)
    k = (a @ g("layers.0.self_attn.k_proj.weight").T).reshape(t, kvh, hd)
    k = rope(rms(k, g("layers.0.self_attn.k_norm.weight")), pos, cfg.rotary_dim, cfg.rope_theta)
    v = (a @ g("layers.0.self_attn.v_proj.weight").T).reshape(t, kvh, hd)
    att = np.zeros((t, nh, hd))
    causal = np.tril(np.ones((t, t), bool))
    for h in range(nh):
        j = h // (nh // kvh)
        s = np.where(causal, q[:, h] @ k[:, j].T / np.sqrt(hd), -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        att[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, j]
    x = x + (att.reshape(t, nh * hd) / (1 + np.exp(-gate))) @ g("layers.0.self_attn.o_proj.weight").T
    m = rms(x, g("layers.0.post_attention_layernorm.weight"))
    gp = m @ g("layers.0.mlp.gate_proj.weight").T
    x = x + (gp / (1 + np.exp(-gp)) * (m @ g("layers.0.mlp.up_proj.weight").T)) @ g("layers.0.mlp.down_proj.weight").T
    return rms(x, g("norm.weight")), x, k, v


def log_softmax(z):
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def ref_drafts(w, cfg, emb_table, lm_head, hid, seq, k, drafts=None, offset=0, feed="normed"):
    """Drafts after the committed seq[:-1] with pending seq[-1]; hid [len(seq)-1, D] the target's
    final-normed states. Each step recomputes every row from scratch; draft row j pairs the previous
    row's output (`feed`: after mtp.norm, or the pre-norm state as a negative control) with the token
    drafted from it (argmax, or `drafts[j]`). Returns the tokens and the log-softmax at each depth."""
    emb = [emb_table[s] for s in seq[1:]]
    rows = list(hid)
    toks, logq = [], []
    for j in range(k):
        o, x, _, _ = mtp_rows(w, cfg, np.array(emb), np.array(rows), np.arange(len(emb)) + offset)
        z = o[-1] @ lm_head
        m = int(np.argmax(z)) if drafts is None else int(drafts[j])
        toks.append(m)
        logq.append(log_softmax(z))
        emb.append(emb_table[m])
        rows.append(o[-1] if feed == "normed" else x[-1])
    return toks, np.array(logq)


_FORWARDS = {}
WIDTH = 160   # every committed sequence here is shorter: one compiled forward per target


def target_hidden(target, tokens):
    """h_t for a committed sequence, from scratch: the last decoder layer's output, final norm (numpy).
    Zero-padded to WIDTH tokens; the forward is causal, so the padding leaves the first rows alone."""
    if id(target) not in _FORWARDS:
        _FORWARDS[id(target)] = (target, jitted(target)[0])
    fwd = _FORWARDS[id(target)][1]
    n = len(tokens)
    assert n <= WIDTH
    _, taps, _, _ = fwd(jnp.asarray([list(tokens) + [0] * (WIDTH - n)]), init_state(target.cfg, 1, WIDTH),
                        trees.chain(1, WIDTH), taps=(target.cfg.num_layers - 1,))
    # The last layer's tap is taken after the final norm, as HF's hidden_states[-1] (tests/test_target.py checks
    # it against transformers): it is h_t itself, not to be normalised again.
    return np.asarray(taps[0, :n, 0], np.float64)


def assert_cache_tracks(target, w, cache, lengths, seqs):
    """The head's cache after any number of rounds equals the one computed from scratch over each
    committed sequence: K/V of rows 0..length-1 (RoPE at the row index), and the rows still waiting."""
    cfg = target.cfg
    emb_table = np.asarray(target.embed_tokens[...], np.float64)
    for b, seq in enumerate(seqs):
        n = int(lengths[b])
        ln, r = int(cache.length[b]), int(cache.n_rows[b])
        assert ln + r == n, (b, ln, r, n)
        hid = target_hidden(target, seq[:n])
        _, _, k, v = mtp_rows(w, cfg, emb_table[seq[1:ln + 1]], hid[:ln], np.arange(ln))
        np.testing.assert_allclose(np.asarray(cache.keys[b, :ln]), k, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(cache.values[b, :ln]), v, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(cache.hidden[b, :r]), hid[ln:n], rtol=1e-4, atol=1e-4)
        assert np.asarray(cache.next_tok[b, :max(r - 1, 0)]).tolist() == list(seq[ln + 1:n])


def run_rounds(engine, prompts, rounds, max_len=256, max_new=200):
    first, state, draft, key = engine.prefill(prompts, max_len)
    b, n = len(prompts), engine.spec.tree_size
    d = Decoding(state, draft, first, jnp.zeros((b, max_new + n), jnp.int32).at[:, 0].set(first),
                 jnp.ones((b,), jnp.int32), jnp.zeros((b,), bool), key, jnp.zeros((b, n + 1), jnp.int32),
                 jnp.zeros((b,), jnp.int32))
    return engine._run(engine.params, d, max_new, rounds)


# ------------------------------------------------------------------------------------------------
# (1) The head against the formula


def test_head_matches_formula_across_prefill_pieces_and_rounds(causal):
    path, target, w = causal
    cfg = target.cfg
    head = load_mtp(path, cfg, "float32")
    k = 3
    spec = MTP(head, cfg, k)
    # Prefill in pieces of 16: the row waiting at the end of a piece is closed by the next piece's first
    # token; the short prompt ends in the first piece and its later pieces are empty.
    rs = np.random.RandomState(0)
    prompts = [rs.randint(0, cfg.vocab_size, size=37).tolist(), rs.randint(0, cfg.vocab_size, size=9).tolist()]
    d = run_rounds(Engine(target, spec, prefill_chunk=16), prompts, rounds=5)
    out, n_out = np.asarray(d.out), np.asarray(d.n_out)
    seqs = [p + out[b, :n_out[b]].tolist() for b, p in enumerate(prompts)]
    lengths = np.asarray(d.state.length)
    assert [len(s) for s in seqs] == (lengths + 1).tolist()    # committed + the pending token
    assert (lengths >= np.array([len(p) for p in prompts]) + 5).all()
    assert_cache_tracks(target, w, d.draft, lengths, seqs)

    # The next round's drafts from that state: greedy tokens, and (sampled at temperature 1) the head's
    # log-probabilities at every depth with the recursion fed the tokens actually drafted.
    gd, tp = nnx.split(target)
    emb_table = np.asarray(target.embed_tokens[...], np.float64)
    lm_head = np.asarray(target.unembedding(), np.float64)
    for s in (Sampling(), Sampling(temperature=1.0)):
        prop, after = jax.jit(lambda hp, tp, c, a, key: spec.propose(hp, nnx.merge(gd, tp), c, a, key, s))(
            spec.params, tp, d.draft, d.pending, jax.random.key(3))
        assert (np.asarray(after.length) == lengths).all() and not np.asarray(after.n_rows).any()
        toks = np.asarray(prop.tokens)
        assert (toks[:, 0] == np.asarray(d.pending)).all()
        for b, seq in enumerate(seqs):
            hid = target_hidden(target, seq[:-1])
            if s.greedy:
                want, _ = ref_drafts(w, cfg, emb_table, lm_head, hid, seq, k)
                assert toks[b, 1:].tolist() == want
                continue
            _, logq = ref_drafts(w, cfg, emb_table, lm_head, hid, seq, k, drafts=toks[b, 1:])
            np.testing.assert_allclose(np.asarray(prop.logq[b, 1:]), logq, rtol=1e-4, atol=1e-4)
            # RoPE at t + 1 (reference notes) instead of t (vLLM): the same distributions, since every
            # query and key shifts alike ...
            _, shifted = ref_drafts(w, cfg, emb_table, lm_head, hid, seq, k, drafts=toks[b, 1:], offset=1)
            np.testing.assert_allclose(shifted, logq, rtol=1e-9, atol=1e-9)
            # ... while feeding back the pre-norm state instead of the output changes depths >= 2, so
            # the comparison above pins the recursion down.
            _, prenorm = ref_drafts(w, cfg, emb_table, lm_head, hid, seq, k, drafts=toks[b, 1:], feed="pre")
            np.testing.assert_allclose(prenorm[0], logq[0], rtol=1e-9, atol=1e-9)
            assert np.abs(prenorm[1:] - logq[1:]).max() > 0.05


# ------------------------------------------------------------------------------------------------
# (2) Lossless greedy


class OracleMTP(MTP):
    """The real head runs (cache, recursion, state) but the verified chain is the target's own greedy
    continuation `ref` with the node at a random depth in 1..k+1 corrupted (k+1: none), so that every
    acceptance length occurs; `update` then takes the accepted tokens from this chain."""

    def __init__(self, head, target, tokens, ref, vocab):
        super().__init__(head, target, tokens)
        self.ref, self.vocab = ref, vocab

    def propose(self, params, model, cache, pending, key, sampling):
        k0, k1, k2 = jax.random.split(key, 3)
        prop, cache = super().propose(params, model, cache, pending, k0, sampling)
        b, n = pending.shape[0], self.tree_size
        ref = jnp.asarray(self.ref)
        # After propose, cache.length is the target's committed length: the pending token's position.
        idx = jnp.clip(cache.length[:, None] + jnp.arange(1, n), 0, ref.shape[1] - 1)
        drafts = jnp.take_along_axis(ref, idx, 1)
        bad = jax.random.randint(k1, (b, 1), 1, n + 1)
        wrong = (drafts + jax.random.randint(k2, drafts.shape, 1, self.vocab)) % self.vocab
        tokens = jnp.concatenate([pending[:, None], jnp.where(jnp.arange(1, n)[None] == bad, wrong, drafts)], 1)
        return Proposal(tokens, prop.tree), dataclasses.replace(cache, drafts=tokens)


def test_update_pairs_each_accepted_row_with_the_next_accepted_token():
    """After a round of drafts (pending, m1, m2, m3) with m1 and m2 accepted (n = 3), row i of the head's next input
    is accepted node i's hidden state with node i+1's token (the last one's, the bonus, comes with `propose`). The
    formula test's random head never accepts two drafts in a round, so it cannot see a shifted pairing."""
    drafts = jnp.asarray([[10, 11, 12, 13]], jnp.int32)
    kv = jnp.zeros((1, 8, 1, 2))
    cache = MTPCache(length=jnp.zeros((1,), jnp.int32), keys=kv, values=kv, hidden=jnp.zeros((1, 4, 2)),
                     next_tok=jnp.zeros((1, 4), jnp.int32), n_rows=jnp.zeros((1,), jnp.int32), drafts=drafts)
    taps = jnp.arange(8, dtype=jnp.float32).reshape(1, 4, 1, 2)
    out = MTP.update(None, None, None, cache, taps, jnp.asarray([[0, 1, 2, 3]], jnp.int32), jnp.asarray([3], jnp.int32))
    assert out.next_tok[0, :2].tolist() == [11, 12] and int(out.n_rows[0]) == 3
    np.testing.assert_array_equal(out.hidden[0, :3], taps[0, :3, 0])


@pytest.mark.parametrize("which", ["causal", "cond"])
def test_greedy_mtp_is_token_identical_to_ar(which, request):
    path, target, w = request.getfixturevalue(which)
    cfg = target.cfg
    head = load_mtp(path, cfg, "float32")
    rs = np.random.RandomState(len(which))
    prompts = [rs.randint(0, cfg.vocab_size, size=n).tolist() for n in (3, 29, 70, 41, 9, 17)]
    k, n_new = 3, 40
    ar = Engine(target).generate(prompts, n_new + k + 1)
    want = [t[:n_new] for t in ar.tokens]

    # The real head with random weights: its drafts are almost never accepted, but it runs every path.
    real = Engine(target, MTP(head, cfg, 2)).generate(prompts, n_new, rounds_per_call=5)
    assert real.tokens == want

    seqs = [p + t for p, t in zip(prompts, ar.tokens)]
    width = max(map(len, seqs))
    ref = np.array([s + [0] * (width - len(s)) for s in seqs], np.int32)
    out = Engine(target, OracleMTP(head, cfg, k, ref, cfg.vocab_size)).generate(prompts, n_new, seed=1,
                                                                                  rounds_per_call=7)
    assert out.tokens == want
    assert (out.hist[1:] > 0).all(), out.hist          # every acceptance length 1 .. k+1
    # Through all those acceptance lengths the head's cache still equals one built from scratch.
    assert_cache_tracks(target, w, out.final.draft, np.asarray(out.final.state.length), seqs)


# ------------------------------------------------------------------------------------------------
# (3) Sampling


def test_sampled_mtp_matches_ar_distribution(tmp_path):
    """Rejection sampling with the real head's draft probabilities vs plain AR sampling, vocabulary 6."""
    vocab, rows = 6, 3000
    target, _ = with_mtp(tmp_path, make_causal_lm, 5, vocab_size=vocab)
    head = load_mtp(tmp_path, target.cfg, "float32")
    # Sharpen the random model's near-uniform distributions (the head shares this lm_head).
    target.lm_head.kernel.set_value(target.lm_head.kernel[...] * 12.0)
    s = Sampling(temperature=1.3, top_k=5, top_p=0.95)
    prompts = [[1, 2, 3, 4]] * rows
    ar = Engine(target, sampling=s).generate(prompts, 3, seed=0).tokens
    sp = Engine(target, MTP(head, target.cfg, 3), sampling=s).generate(prompts, 3, seed=1)
    assert not _chi2_exceeds(ar, sp.tokens, vocab)
    # Both the accept and the residual paths ran.
    assert sp.hist[1] > 0 and sp.hist[2:].sum() > 0, sp.hist
    other = Engine(target, sampling=Sampling(temperature=0.7, top_k=5, top_p=0.95)).generate(prompts, 3, seed=2)
    assert _chi2_exceeds(ar, other.tokens, vocab)


# ------------------------------------------------------------------------------------------------
# (4) Weights and bad input


def test_weights_from_hf_and_converted_dirs(causal, tmp_path):
    path, target, w = causal
    head = load_mtp(path, target.cfg)
    params = split_params(target.cfg, {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(head))})
    for key, (p, _, kind) in mtp_layout(target.cfg).items():
        np.testing.assert_array_equal(params[p], w[key].T if kind == "linear" else w[key], err_msg=key)
    from convert.store import save_converted
    out = save_converted(target, tmp_path / "out", path)
    again = load_mtp(out, target.cfg, "bfloat16")
    fused = {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(head))}
    for p, v in nnx.to_flat_state(nnx.state(again)):
        assert v.get_value().dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(v.get_value()), fused[p].astype(jnp.bfloat16), err_msg=str(p))


def test_mixed_dtype_checkpoint_loads(tmp_path):
    make_causal_lm(tmp_path)
    mtp = fake_mtp()                          # half of the tensors bf16, half fp32
    add_mtp(tmp_path, mtp)
    target = load_target(tmp_path, dtype="float32")
    head = load_mtp(tmp_path, target.cfg)
    assert head.layers[0].self_attn.qkv_proj.kernel[...].dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(head.fc.kernel[...]), mtp["mtp.fc.weight"].astype(np.float32).T)


def test_bad_checkpoints(causal, tmp_path, tiny_hf):
    path, target, w = causal
    with pytest.raises(CheckpointError, match="no mtp") as e:
        load_mtp(tiny_hf[0], target.cfg)
    assert str(tiny_hf[0]) in str(e.value)

    def broken(name, edit):
        dst = tmp_path / name
        shutil.copytree(path, dst)
        rewrite(dst / "model.safetensors", edit)
        return dst

    bad = broken("shape", lambda t: {**t, "mtp.fc.weight": t["mtp.fc.weight"][:, :-1]})
    with pytest.raises(CheckpointError, match=r"'mtp\.fc\.weight' has shape \[64, 127\].*\[64, 128\]") as e:
        load_mtp(bad, target.cfg)
    assert str(bad) in str(e.value)
    bad = broken("missing", lambda t: {k: v for k, v in t.items() if k != "mtp.layers.0.self_attn.k_norm.weight"})
    with pytest.raises(CheckpointError, match=r"missing MTP tensor\(s\) 'mtp\.layers\.0\.self_attn\.k_norm\.weight'"):
        load_mtp(bad, target.cfg)
    bad = broken("extra", lambda t: {**t, "mtp.layers.1.input_layernorm.weight": t["mtp.norm.weight"]})
    with pytest.raises(CheckpointError, match=r"unexpected MTP tensor\(s\) 'mtp\.layers\.1\.input_layernorm"):
        load_mtp(bad, target.cfg)


def test_bad_sharded_head_is_refused_from_headers_naming_its_file(cond, tmp_path, monkeypatch):
    """In a sharded checkpoint the head lives in its own shard: errors name that file, and come from the headers,
    before any tensor is read (the real head is ~1 GB)."""
    import convert.hf as hf
    path, target, _ = cond
    reads = []
    monkeypatch.setattr(hf, "_read", lambda info, handles: reads.append(info.key))

    def broken(name, edit):
        dst = tmp_path / name
        shutil.copytree(path, dst)
        file = dst / "model-mtp.safetensors"
        rewrite(file, edit)
        index = dst / "model.safetensors.index.json"
        data = json.loads(index.read_text())
        data["weight_map"].update({k: file.name for k in read_file(file)[0]})
        index.write_text(json.dumps(data))
        return file

    for name, edit, words in [
            ("shape", lambda t: {**t, "mtp.fc.weight": t["mtp.fc.weight"][:, :-1]}, r"'mtp\.fc\.weight' has shape"),
            ("int", lambda t: {**t, "mtp.norm.weight": t["mtp.norm.weight"].astype(np.int32)},
             r"'mtp\.norm\.weight' is stored as I32; only floating-point"),
            ("extra", lambda t: {**t, "mtp.layers.1.mlp.up_proj.weight": t["mtp.norm.weight"]},
             r"unexpected MTP tensor\(s\) 'mtp\.layers\.1\.mlp\.up_proj\.weight'.*mtp\.fc\.weight"),
            ("quant", lambda t: {**t, "mtp.fc.weight_scale_inv": t["mtp.norm.weight"]},
             r"'mtp\.fc\.weight_scale_inv' .* quantization tensor")]:
        file = broken(name, edit)
        with pytest.raises(CheckpointError, match=words) as e:
            load_mtp(file.parent, target.cfg)
        assert str(e.value).startswith(str(file)), (name, str(e.value))
    assert reads == []


def test_bad_speculator_arguments(causal):
    path, target, w = causal
    head = MTPHead(target.cfg, rngs=nnx.Rngs(0))
    for k in (0, -2):
        with pytest.raises(ConfigError, match="--mtp-tokens"):
            MTP(head, target.cfg, k)
    with pytest.raises(ConfigError, match="hidden_size"):
        MTP(MTPHead(target.cfg.replace(hidden_size=32), rngs=nnx.Rngs(0)), target.cfg, 2)
    spec = MTP(head, target.cfg, 4)
    assert spec.tree_size == 5 and spec.taps == (target.cfg.num_layers - 1,)


# ------------------------------------------------------------------------------------------------
# CLI


@pytest.mark.parametrize("argv,words", [
    (["--method", "mtp", "--mtp-tokens", "0"], "--mtp-tokens must be >= 1"),
    (["--mtp-tokens", "2"], "--mtp-tokens only applies to --method mtp"),
    (["--method", "mtp", "--draft", "x"], "--draft/--block-size"),
])
def test_cli_flag_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_cli_model_without_mtp_weights(tiny_hf, capsys):
    with pytest.raises(SystemExit) as e:
        # "x" is a single low token id, inside the tiny model's vocabulary of 512.
        main(["--model", str(tiny_hf[0]), "--method", "mtp", "--prompt", "x"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--method mtp" in err and "no mtp" in err and str(tiny_hf[0]) in err


def test_cli_mtp_prints_the_ar_text(capsys, monkeypatch, tmp_path):
    # Without the demo pair (it has no MTP head) the default tiny random model gets a random head: greedy MTP
    # must print exactly the AR text. Its lm_head here keeps 1 of its 248320 columns (every other logit 0), so
    # target and head, which shares it, choose between 2 tokens and the head's drafts are accepted (over the
    # whole vocabulary they almost never are, and then any drafts give AR's text).
    import jaxspec.model

    class Sharpened(jaxspec.model.Qwen35):
        def __init__(self, cfg, *, rngs):
            super().__init__(cfg, rngs=rngs)
            self.lm_head.kernel.set_value(self.lm_head.kernel[...].at[:, 1:].set(0.0))

    monkeypatch.setattr(jaxspec.model, "Qwen35", Sharpened)
    monkeypatch.setenv("JAXSPEC_DEMO_DIR", str(tmp_path / "no-demo"))
    args = ["--max-new-tokens", "10", "--ignore-eos", "--prompt", "def f(x):"]
    assert main(args) == 0
    ar = capsys.readouterr()
    assert main(args + ["--method", "mtp", "--mtp-tokens", "2"]) == 0
    mtp = capsys.readouterr()
    assert mtp.out == ar.out and "method mtp" in mtp.err and "acceptance histogram" in mtp.err
    hist = mtp.err.split("[acceptance histogram (tokens per round: rounds): ", 1)[1].split("]", 1)[0]
    tau = float(mtp.err.split(" tokens/round", 1)[0].rsplit("tau ", 1)[1])
    assert tau > 1.5 and ("2:" in hist or "3:" in hist), mtp.err      # 1.80 on this CPU


def test_cli_mtp_tensor_parallel(causal, monkeypatch, capsys):
    """--method mtp with --tp 2 --dp 1 loads the checkpoint's head, lays it out like the target and drafts
    exactly what it drafts on one device, round by round: the same drafted tokens (the random head's drafts
    over the 512-token vocabulary, almost never accepted, so each round's drafts are the head's own argmaxes
    and a wrongly laid-out head changes them), the same acceptance histogram and the same text."""
    drafts = []
    propose = MTP.propose

    def recording(self, *a, **kw):
        prop, cache = propose(self, *a, **kw)
        jax.debug.callback(lambda n, t: drafts[-1].append((int(n[0]), np.asarray(t).tolist())),
                           cache.length, prop.tokens)
        return prop, cache

    monkeypatch.setattr(MTP, "propose", recording)
    args = ["--model", str(causal[0]), "--max-new-tokens", "10", "--ignore-eos", "--prompt", "x",
            "--method", "mtp", "--mtp-tokens", "2"]
    runs = []
    for tp in ([], ["--tp", "2"]):
        drafts.append([])
        assert main(args + tp) == 0
        runs.append(capsys.readouterr())
    one, two = runs
    assert two.out == one.out and "method mtp" in two.err
    hist = lambda err: err.split("[acceptance histogram", 1)[1].split("]", 1)[0]
    assert hist(two.err) == hist(one.err), (one.err, two.err)
    assert len(drafts[0]) >= 5, drafts        # one entry per round (9 rounds on this CPU)
    assert sorted(drafts[1]) == sorted(drafts[0])
