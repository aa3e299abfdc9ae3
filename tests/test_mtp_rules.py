"""The MTP speculator's contract with its callers. MTP() refuses a head shaped for another target in every config
field that shapes the head's weights or arithmetic, naming the field and both values, and refuses a draft count that
is not an integer. Its drafts never name the padding columns that a tensor-parallel vocabulary adds past
vocab_size, greedy or sampled. `python -m jaxspec.generate --method mtp` drafts --mtp-tokens tokens per round (3
unless given) with the checkpoint's head loaded in the target's --dtype. A checkpoint missing head tensors is refused
with an error naming its directory."""

from __future__ import annotations

import dataclasses
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec.config import ConfigError, load_target_config
from jaxspec.mtp import MTP, MTPHead
from jaxspec.sampling import Sampling


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """The default tiny hybrid target (fp32 on disk) with random `mtp.*` tensors added (tests/test_mtp.py)."""
    from conftest import make_causal_lm
    from test_mtp import with_mtp
    path = tmp_path_factory.mktemp("mtp_rules")
    with_mtp(path, make_causal_lm, 31)
    return path


# ------------------------------------------------------------------------------------------------
# MTP(): the head must be this target's


@pytest.mark.parametrize("field,value", [("intermediate_size", 96), ("num_heads", 8), ("num_kv_heads", 4),
                                         ("head_dim", 16), ("rotary_dim", 16), ("rope_theta", 1e4),
                                         ("rms_norm_eps", 1e-5)])
def test_a_head_of_another_shape_is_refused_naming_the_field(ckpt, field, value):
    """A head built for a target differing in one field alone (a field its weights or arithmetic depend on) is
    refused, the error naming that field with the head's and the target's values; the target's own head is taken."""
    cfg = load_target_config(ckpt, dtype="float32")
    assert getattr(cfg, field) != value
    MTP(MTPHead(cfg, rngs=nnx.Rngs(1)), cfg, 2)
    head = MTPHead(cfg.replace(**{field: value}), rngs=nnx.Rngs(1))
    with pytest.raises(ConfigError, match="does not belong to this target") as e:
        MTP(head, cfg, 2)
    assert f"{field}: head {value} vs target {getattr(cfg, field)}" in str(e.value), str(e.value)


def test_the_engine_refuses_an_mtp_built_for_another_target(ckpt):
    """An MTP whose head matches the config it was built with, but that config is not the engine's model's (in its
    shapes, or only in the attention the head runs: RoPE theta, kv heads, the norm's eps): refused in Engine(),
    naming the speculator and each differing field with both values."""
    from jaxspec.engine import Engine
    from jaxspec.model import Qwen35
    cfg = load_target_config(ckpt, dtype="float32")
    target = Qwen35(cfg, rngs=nnx.Rngs(9))
    Engine(target, MTP(MTPHead(cfg, rngs=nnx.Rngs(1)), cfg, 2))
    for field, value in (("hidden_size", 96), ("vocab_size", 640), ("rope_theta", 1e4), ("num_kv_heads", 4),
                         ("rms_norm_eps", 1e-5)):
        other = cfg.replace(**{field: value})
        with pytest.raises(ConfigError, match=f"mtp speculator was built for another target.*{field} {value} vs "
                                              f"{getattr(cfg, field)}"):
            Engine(target, MTP(MTPHead(other, rngs=nnx.Rngs(1)), other, 2))


@pytest.mark.parametrize("tokens", [2.0, 2.5, True, "2"], ids=repr)
def test_a_draft_count_that_is_not_an_integer_is_refused(ckpt, tokens):
    """--mtp-tokens must be an integer: never truncated, never a bool taken as 1; numpy integers are taken."""
    cfg = load_target_config(ckpt, dtype="float32")
    head = MTPHead(cfg, rngs=nnx.Rngs(2))
    with pytest.raises(ConfigError, match=r"--mtp-tokens must be an integer, got " + repr(tokens).replace(".", r"\.")):
        MTP(head, cfg, tokens)
    spec = MTP(head, cfg, np.int64(2))
    assert type(spec.k) is int and spec.k == 2 and spec.tree_size == 3


# ------------------------------------------------------------------------------------------------
# Drafts over a padded vocabulary


@pytest.mark.parametrize("s", [Sampling(), Sampling(temperature=1.0)], ids=["greedy", "sampled"])
def test_drafts_never_name_a_padding_column(ckpt, s):
    """A target whose vocabulary is padded past vocab_size (as tensor parallelism pads it), its padding columns of
    lm_head made to dominate every logit (a pair +-100 w per random w): every draft is still a real token id, and
    sampled drafts report probability 0 (log q = -inf) at every padding column."""
    from convert.mtp import load_mtp
    from jaxspec.model import Qwen35
    cfg = load_target_config(ckpt, dtype="float32")
    pad = 8
    target = Qwen35(cfg.replace(padded_vocab=cfg.vocab_size + pad), rngs=nnx.Rngs(3))
    rng = np.random.default_rng(4)
    w = rng.standard_normal((cfg.hidden_size, pad // 2)).astype(np.float32) * 100.0
    kernel = target.lm_head.kernel[...]
    target.lm_head.kernel.set_value(kernel.at[:, cfg.vocab_size:].set(jnp.asarray(np.concatenate([w, -w], 1))))
    spec = MTP(load_mtp(ckpt, cfg, "float32"), target.cfg, 3)
    b = 6
    cache = spec.init(b, 16)
    cache = dataclasses.replace(cache, hidden=jnp.asarray(rng.standard_normal(cache.hidden.shape), jnp.float32),
                                n_rows=jnp.ones((b,), jnp.int32))
    pending = jnp.asarray(rng.integers(0, cfg.vocab_size, b), jnp.int32)
    prop, _ = spec.propose(spec.params, target, cache, pending, jax.random.key(5), s)
    toks = np.asarray(prop.tokens)
    assert toks.shape == (b, 4) and (toks[:, 0] == np.asarray(pending)).all()
    assert ((toks >= 0) & (toks < cfg.vocab_size)).all(), toks
    if not s.greedy:
        logq = np.asarray(prop.logq)
        assert logq.shape == (b, 4, cfg.vocab_size + pad)
        assert np.isneginf(logq[:, 1:, cfg.vocab_size:]).all()
        np.testing.assert_allclose(np.exp(logq[:, 1:, :cfg.vocab_size]).sum(-1), 1.0, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# Waiting rows


def test_drafts_follow_the_last_of_several_waiting_rows(ckpt):
    """A round that accepts drafts leaves several rows waiting (their target states and next tokens); propose runs
    them all, the last closed by the pending token, and drafts from that last row. So drafting after a prefill of P
    tokens equals drafting after a prefill of P - 2 tokens whose last 3 rows are left waiting, as `update` leaves
    them after 2 accepted drafts: the same tokens and the same log q at every depth, and the same head cache."""
    from convert.mtp import load_mtp
    from jaxspec.model import Qwen35
    cfg = load_target_config(ckpt, dtype="float32")
    target = Qwen35(cfg, rngs=nnx.Rngs(6))
    spec = MTP(load_mtp(ckpt, cfg, "float32"), cfg, 3)
    b, p = 3, 9
    rng = np.random.default_rng(7)
    taps = jnp.asarray(rng.standard_normal((b, p, 1, cfg.hidden_size)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (b, p)), jnp.int32)
    pending = jnp.asarray(rng.integers(0, cfg.vocab_size, b), jnp.int32)
    full = jnp.full((b,), p, jnp.int32)
    one = spec.start(spec.params, target, spec.init(b, 32), taps, full, tokens)
    two = spec.start(spec.params, target, spec.init(b, 32), taps[:, :p - 2], full - 2, tokens[:, :p - 2])
    two = dataclasses.replace(two, hidden=two.hidden.at[:, :3].set(taps[:, p - 3:, 0]),
                              next_tok=two.next_tok.at[:, :2].set(tokens[:, p - 2:]), n_rows=jnp.full((b,), 3))
    # Slots past the waiting rows (and the last one's token slot) hold what earlier rounds left: unrelated junk.
    junk = lambda c, r: dataclasses.replace(
        c, hidden=c.hidden.at[:, r:].set(jnp.asarray(rng.standard_normal(c.hidden[:, r:].shape), jnp.float32)),
        next_tok=c.next_tok.at[:, r - 1:].set(jnp.asarray(rng.integers(0, cfg.vocab_size, (b, 5 - r)), jnp.int32)))
    one, two = junk(one, 1), junk(two, 3)
    assert np.asarray(one.length).tolist() == [p - 1] * b and np.asarray(two.length).tolist() == [p - 3] * b
    for s in (Sampling(), Sampling(temperature=1.0)):
        (pa, ca), (pb, cb) = (spec.propose(spec.params, target, c, pending, jax.random.key(8), s) for c in (one, two))
        assert np.asarray(ca.length).tolist() == np.asarray(cb.length).tolist() == [p] * b
        np.testing.assert_allclose(np.asarray(cb.keys[:, :p]), np.asarray(ca.keys[:, :p]), rtol=1e-4, atol=1e-4)
        assert np.asarray(pb.tokens).tolist() == np.asarray(pa.tokens).tolist(), s
        if not s.greedy:
            np.testing.assert_allclose(np.asarray(pb.logq), np.asarray(pa.logq), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# The command line


class _Built(Exception):
    """Raised where the CLI builds the speculator: what it was built with is all these tests look at."""


@pytest.mark.parametrize("flags,tokens", [([], 3), (["--mtp-tokens", "1"], 1), (["--mtp-tokens", "5"], 5)])
def test_cli_builds_the_head_with_the_flags(ckpt, flags, tokens, monkeypatch):
    """--method mtp on a checkpoint: the speculator drafts --mtp-tokens tokens (3 when the flag is absent), and the
    head, read from the fp32 checkpoint, is in the target's --dtype bfloat16, as the target is."""
    from jaxspec.generate import main
    seen = []

    def built(self, head, target, k):
        seen.append((k, target.dtype, {str(v.get_value().dtype) for _, v in nnx.to_flat_state(nnx.state(head))}))
        raise _Built
    monkeypatch.setattr(MTP, "__init__", built)
    with pytest.raises(_Built):
        main(["--model", str(ckpt), "--method", "mtp", "--dtype", "bfloat16", "--prompt", "x",
              "--max-new-tokens", "2"] + flags)
    assert seen == [(tokens, "bfloat16", {"bfloat16"})], seen


# ------------------------------------------------------------------------------------------------
# Loading


def test_missing_head_tensors_are_refused_naming_the_directory(ckpt, tmp_path):
    """A checkpoint whose head lacks tensors: the error names the checkpoint directory (no file holds a missing key)
    and the first missing keys."""
    from convert.hf import CheckpointError
    from convert.mtp import load_mtp
    from test_convert import rewrite
    dst = tmp_path / "ckpt"
    shutil.copytree(ckpt, dst)
    gone = ("mtp.norm.weight", "mtp.fc.weight")
    rewrite(dst / "model.safetensors", lambda t: {k: v for k, v in t.items() if k not in gone})
    with pytest.raises(CheckpointError, match=r"missing MTP tensor\(s\) 'mtp\.fc\.weight', 'mtp\.norm\.weight'") as e:
        load_mtp(dst, load_target_config(dst, dtype="float32"))
    assert str(e.value).startswith(f"{dst}: "), str(e.value)
