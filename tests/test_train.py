"""Drafter training (jaxspec/train.py) and the HF exporter (jaxspec/export.py), at toy shapes on CPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sysconfig
import time
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec import train
from jaxspec.config import FULL
from jaxspec.drafter import Drafter
from jaxspec.drafter_config import SLIDING, DrafterConfig
from jaxspec.model import Qwen35
from jaxspec.tree import chain


def tiny_target(seed=0, dtype="float32"):
    cfg = train.tiny_sizes().target.replace(dtype=dtype)
    return Qwen35(cfg, rngs=nnx.Rngs(seed))


def tiny_drafter(layer_types=(FULL, SLIDING), window=5, block=6, seed=1, dtype="float32", scale=None):
    tcfg = train.tiny_sizes().target
    cfg = DrafterConfig(vocab_size=tcfg.vocab_size, hidden_size=tcfg.hidden_size, intermediate_size=48,
                        num_heads=2, num_kv_heads=1, head_dim=16, layer_types=tuple(layer_types), rope_theta=1e4,
                        target_layer_ids=(0, 2), mask_token_id=1, block_size=block, sliding_window=window,
                        dtype=dtype)
    d = Drafter(cfg, rngs=nnx.Rngs(seed))
    if scale:  # O(1) weights, so that a wrong mask shows in the logits
        _, st = nnx.split(d)
        keys = jax.random.split(jax.random.key(seed), len(jax.tree.leaves(st)))
        st = jax.tree.unflatten(jax.tree.structure(st), [
            (jax.random.normal(k, x.shape) / np.sqrt(x.shape[0]) if x.ndim == 2 else 1 + 0.3 * jax.random.normal(k, x.shape)).astype(x.dtype)
            for k, x in zip(keys, jax.tree.leaves(st))])
        nnx.update(d, st)
    return d


# ------------------------------------------------------------------------------------------------
# Masks and the loss


def recipe_mask(anchors, t, block, causal, window):
    """reference/dflash.md section 4, written out one query and key at a time."""
    b, a = anchors.shape
    m = np.zeros((b, a * block, t + a * block), bool)
    for s in range(b):
        for j in range(a):
            for i in range(block):
                q = anchors[s, j] + i
                allow = lambda kp: (not causal or q - kp >= 0) and (window is None or abs(q - kp) < window)
                for p in range(t):
                    m[s, j * block + i, p] = p < anchors[s, j] and allow(p)
                for i2 in range(block):
                    m[s, j * block + i, t + j * block + i2] = allow(anchors[s, j] + i2)
    return m


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 3), (False, 4), (False, 2)])
def test_block_masks_equal_the_recipe(causal, window):
    """(False, 2): a two-sided window narrower than the block, so that it also hides block slots ahead."""
    anchors = np.array([[1, 4, 9], [0, 2, 10]], np.int32)
    t, block = 14, 4
    got, q_pos = train.block_masks(jnp.asarray(anchors), t, block, causal, window)
    np.testing.assert_array_equal(np.asarray(got), recipe_mask(anchors, t, block, causal, window))
    np.testing.assert_array_equal(np.asarray(q_pos)[0, :4], [1, 2, 3, 4])


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 3), (False, 2)])
def test_block_masks_equal_z_labs_inference_mask(causal, window):
    """Each block's rows of `block_masks` against z-lab's `dflash.model._attention_mask` for that block drafted
    after exactly its anchor's context rows (keys = context 0..anchor-1, then the block): the context columns from
    the anchor on and the other blocks' columns hidden. (torch and dflash come with the test extra.)"""
    import torch
    from dflash import model as zlab
    anchors = np.array([[1, 4, 9], [0, 2, 10]], np.int32)
    t, block = 14, 4
    got = np.asarray(train.block_masks(jnp.asarray(anchors), t, block, causal, window)[0])
    for s in range(2):
        for j, a in enumerate(anchors[s]):
            want = zlab._attention_mask(torch.zeros(1, 1, block, 1), torch.zeros(1, 1, a + block, 1),
                                        is_causal=causal, sliding_window=window)[0, 0].numpy()
            rows = got[s, j * block:(j + 1) * block]
            np.testing.assert_array_equal(rows[:, :a], want[:, :a])
            assert not rows[:, a:t].any()
            np.testing.assert_array_equal(rows[:, t + j * block:t + (j + 1) * block], want[:, a:])
            assert rows[:, t:].sum() == rows[:, t + j * block:t + (j + 1) * block].sum()


@pytest.mark.parametrize("layer_types", [(FULL, FULL), (SLIDING, FULL)])
def test_training_logits_equal_inference_draft(layer_types):
    """Every block of the training forward = `Drafter.add_context` (rows before the anchor) + `draft`."""
    drafter = tiny_drafter(layer_types, window=5, scale=True)
    cfg = drafter.cfg
    b, t = 2, 20
    rng = np.random.default_rng(0)
    taps = jnp.asarray(rng.normal(size=(b, t, cfg.n_taps, cfg.hidden_size)), jnp.float32)
    tokens = jnp.asarray(rng.integers(2, cfg.vocab_size, (b, t)), jnp.int32)
    anchors = jnp.asarray([[1, 7, 12], [3, 5, 14]], jnp.int32)
    embed = jnp.asarray(rng.normal(size=(cfg.vocab_size, cfg.hidden_size)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(cfg.hidden_size, cfg.vocab_size)) / 6, jnp.float32)
    g, p = nnx.split(drafter)

    @jax.jit
    def one_block(p, taps, anchor_tok, n):
        d = nnx.merge(g, p)
        return d.draft(d.add_context(d.init_cache(1, t), taps, n), anchor_tok, embed, head)[0]

    with jax.default_matmul_precision("highest"):
        got = jax.jit(lambda p: train.drafter_block_logits(nnx.merge(g, p), taps, tokens, anchors, embed, head))(p)
        for s in range(b):
            for j in range(anchors.shape[1]):
                a = int(anchors[s, j])
                want = one_block(p, taps[s:s + 1], tokens[s:s + 1, a], jnp.asarray(a, jnp.int32))
                np.testing.assert_allclose(np.asarray(got[s, j]), np.asarray(want[0]), rtol=2e-5, atol=2e-5)


def test_loss_weights():
    w = train.loss_weights(16, train.default_gamma(16))
    assert train.default_gamma(16) == 7.0 and len(w) == 15
    np.testing.assert_allclose(w, np.exp(-np.arange(15) / 7.0), rtol=1e-6)


def test_default_gamma_is_the_recipes():
    """reference/dflash.md section 4: gamma 7 for B = 16, 5 for B = 10, 4 for B = 8."""
    assert [train.default_gamma(b) for b in (16, 10, 8)] == [7.0, 5.0, 4.0]


def test_loss_is_weighted_mean_of_slot_ce():
    target, drafter = tiny_target(), tiny_drafter((FULL,), block=4)
    tg, tp = nnx.split(target)
    dg, dp = nnx.split(drafter)
    rng = np.random.default_rng(1)
    batch = {"tokens": jnp.asarray(rng.integers(2, 320, (2, 16)), jnp.int32),
             "anchors": jnp.asarray([[2, 9], [0, 11]], jnp.int32)}
    loss = jax.jit(train.drafter_loss(dg, tg, 2.0))(dp, tp, batch)

    @jax.jit
    def block_logits(dp, tp, batch):
        target, drafter = nnx.merge(tg, tp), nnx.merge(dg, dp)
        _, taps, _, _ = target(batch["tokens"], target.init_state(2, 16), chain(2, 16), taps=(0, 2))
        return train.drafter_block_logits(drafter, taps, batch["tokens"], batch["anchors"], target.embed_tokens[...],
                                          target.unembedding())

    logits = block_logits(dp, tp, batch)
    logp = np.asarray(jax.nn.log_softmax(logits, -1))
    w = np.exp(-np.arange(3) / 2.0)
    total = 0.0
    for s in range(2):
        for j in range(2):
            a = int(batch["anchors"][s, j])
            ce = [-logp[s, j, k - 1, int(batch["tokens"][s, a + k])] for k in range(1, 4)]
            total += (w * ce).sum() / w.sum()
    np.testing.assert_allclose(float(loss), total / 4, rtol=1e-5)


def test_sample_anchors():
    a = train.sample_anchors(np.random.default_rng(0), 3, 40, 8, 5, np.array([10, 0, 27]))
    assert a.shape == (3, 5) and (np.diff(a, axis=1) > 0).all()
    assert (a[0] >= 10).all() and (a <= 32).all() and (a[2] >= 27).all()
    with pytest.raises(ValueError, match="valid anchor positions for 14 anchors"):
        train.sample_anchors(np.random.default_rng(0), 1, 20, 8, 14, 0)


def test_sample_anchors_span_lo_to_t_minus_block():
    """As many anchors as valid positions: every position from lo to t - B (both ends included) is an anchor."""
    a = train.sample_anchors(np.random.default_rng(0), 2, 12, 4, 6, 3)
    np.testing.assert_array_equal(a, [np.arange(3, 9)] * 2)
    a = train.sample_anchors(np.random.default_rng(1), 2, 12, 4, 3, np.array([0, 6]))
    np.testing.assert_array_equal(a[1], [6, 7, 8])


def test_batches_draw_other_anchors_per_sequence_and_step_and_reach_every_sequence():
    """Anchors are drawn per sequence (64 sequences with one lo give more than 32 distinct anchor sets), the batches
    of `drafter_batches` and `cached_batches` differ from step to step, and 50 steps reach every sequence."""
    a = train.sample_anchors(np.random.default_rng(0), 64, 40, 4, 3, 2)
    assert len({tuple(r) for r in a}) > 32
    seqs = np.arange(8 * 24, dtype=np.int32).reshape(8, 24)         # row i starts with 24 i
    cache = type("Cache", (), {"arrays": lambda self: (seqs, seqs + 1, np.zeros((8, 24, 2, 4), np.float16))})()
    for f in (train.drafter_batches(seqs, 1, 4, 4, 3, seed=0), train.cached_batches(cache, 8, 4, 4, 3, 1, seed=0)):
        x, y = f(0), f(1)
        assert not np.array_equal(x["tokens"], y["tokens"]) and not np.array_equal(x["anchors"], y["anchors"])
        assert {int(r) // 24 for s in range(50) for r in f(s)["tokens"][:, 0]} == set(range(8))


# ------------------------------------------------------------------------------------------------
# Teacher-forced corpus data (FeatureCache, block_labels, the cached loss)


def test_block_labels_follow_the_greedy_path():
    #            position: 0  1  2  3  4  5  6  7
    tokens = jnp.asarray([[5, 6, 7, 8, 9, 10, 11, 12]], jnp.int32)
    greedy = jnp.asarray([[6, 7, 3, 9, 10, 4, 12, 0]], jnp.int32)   # the target's next token after each position
    labels, valid = train.block_labels(tokens, greedy, jnp.asarray([[0, 3]]), 4)
    np.testing.assert_array_equal(labels, [[[6, 7, 3], [9, 10, 4]]])
    # anchor 0: stream follows greedy at 1 and 2 -> all slots exact; anchor 3: follows at 4, 5 -> exact
    np.testing.assert_array_equal(valid, [[[1, 1, 1], [1, 1, 1]]])
    labels, valid = train.block_labels(tokens, greedy, jnp.asarray([[1, 2]]), 4)
    np.testing.assert_array_equal(labels, [[[7, 3, 9], [3, 9, 10]]])
    # anchor 1: tokens[3] = 8 != greedy[2] = 3, so slot 3 is masked; anchor 2: slot 1 only
    np.testing.assert_array_equal(valid, [[[1, 1, 0], [1, 0, 0]]])
    _, valid = train.block_labels(tokens, greedy, jnp.asarray([[1, 2]]), 4, exact=False)
    assert bool(valid.all())


def test_cached_loss_counts_only_the_slots_on_the_targets_greedy_path():
    """`drafter_loss_cached` on a drafter of O(1) weights, with a greedy path that the stream leaves inside some
    blocks, against a loop over the slots: sum of w_k x CE over the slots before the first one off the path, over
    the sum of those w_k, w_k = exp(-(k - 1) / gamma); exact=False (--stream-labels): over all slots."""
    d = tiny_drafter((FULL,), block=4, scale=True)
    dg, dp = nnx.split(d)
    cfg = d.cfg
    rng = np.random.default_rng(3)
    toks = rng.integers(2, cfg.vocab_size, (2, 16)).astype(np.int32)
    greedy = np.roll(toks, -1, 1)                         # the stream follows the target's greedy path ...
    for s, p in ((0, 5), (1, 3), (1, 10)):                # ... but for the token after position p
        greedy[s, p] = 2 + (toks[s, p + 1] - 1) % (cfg.vocab_size - 2)
    anchors = np.array([[4, 9], [2, 10]], np.int32)       # blocks cut after slot 2, none, 2 and 1
    taps = rng.normal(size=(2, 16, cfg.n_taps, cfg.hidden_size)).astype(np.float16)
    frozen = {"embed": rng.normal(size=(cfg.vocab_size, cfg.hidden_size)).astype(np.float32),
              "lm_head": (rng.normal(size=(cfg.hidden_size, cfg.vocab_size)) / 6).astype(np.float32)}
    batch = {"tokens": toks, "greedy": greedy, "taps": taps, "anchors": anchors}
    got = {exact: float(jax.jit(train.drafter_loss_cached(dg, 2.0, exact=exact))(dp, frozen, batch))
           for exact in (True, False)}
    logp = np.asarray(jax.nn.log_softmax(train.drafter_block_logits(
        d, jnp.asarray(taps), jnp.asarray(toks), jnp.asarray(anchors), frozen["embed"], frozen["lm_head"]), -1),
        np.float64)                                       # [b, A, B-1, V]
    sums = {True: [0.0, 0.0], False: [0.0, 0.0]}
    counted = []
    for s in range(2):
        for j, a in enumerate(anchors[s]):
            on_path = True
            for k in range(1, 4):
                on_path = on_path and (k == 1 or toks[s, a + k - 1] == greedy[s, a + k - 2])
                w, ce = np.exp(-(k - 1) / 2.0), -logp[s, j, k - 1, greedy[s, a + k - 1]]
                for exact in (True, False):
                    if on_path or not exact:
                        sums[exact][0] += w * ce
                        sums[exact][1] += w
                counted.append(on_path)
    assert counted == [1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 0, 0]
    for exact in (True, False):
        assert got[exact] == pytest.approx(sums[exact][0] / sums[exact][1], rel=1e-4)


def test_feature_cache_builds_resumes_and_matches_the_online_loss(tmp_path):
    target, drafter = tiny_target(), tiny_drafter((FULL,), block=4)
    tg, tp = nnx.split(target)
    dg, dp = nnx.split(drafter)
    stream = np.random.default_rng(0).integers(2, 320, 200).astype(np.int32)
    starts = train.corpus_windows(stream, 24, seed=3)
    assert len(starts) == 8 and sorted(starts) == list(range(0, 192, 24))
    cache = train.FeatureCache(tmp_path / "f")
    assert cache.build(target, stream, (0, 2), 24, 6, seed=3, batch=4, deadline=0.0) == 4   # "interrupted"
    cache = train.FeatureCache(tmp_path / "f")
    assert cache.done == 4 and cache.build(target, stream, (0, 2), 24, 6, seed=3, batch=4) == 6
    # Other tokens of the same length, or another target: made again, not reused.
    other = train.FeatureCache(tmp_path / "g")
    other.build(target, stream[::-1].copy(), (0, 2), 24, 6, seed=3, batch=4)
    assert other.build(target, stream, (0, 2), 24, 6, seed=3, batch=4, deadline=0.0) == 4
    np.testing.assert_array_equal(other.arrays()[0][:4], np.stack([stream[s:s + 24] for s in starts[:4]]))
    assert train.FeatureCache(tmp_path / "g").build(tiny_target(seed=1), stream, (0, 2), 24, 6, seed=3, batch=4,
                                                    deadline=0.0) == 4
    toks, greedy, taps = cache.arrays()
    np.testing.assert_array_equal(toks, np.stack([stream[s:s + 24] for s in starts[:6]]))
    logits, ref_taps, _, _ = target(jnp.asarray(toks), target.init_state(6, 24), chain(6, 24), taps=(0, 2))
    np.testing.assert_array_equal(greedy, np.asarray(jnp.argmax(logits, -1)))
    np.testing.assert_allclose(np.asarray(taps, np.float32), ref_taps, rtol=2e-3, atol=2e-3)
    # With the greedy path equal to the stream, the cached loss is the online DFlash loss (fp16 taps aside).
    anchors = jnp.asarray([[2, 9], [0, 11]], jnp.int32)
    tok2 = jnp.asarray(toks[:2])
    batch = {"tokens": tok2, "greedy": jnp.concatenate([tok2[:, 1:], tok2[:, :1]], 1), "taps": jnp.asarray(taps[:2]),
             "anchors": anchors}
    frozen = {"embed": target.embed_tokens[...], "lm_head": target.unembedding()}
    cached = train.drafter_loss_cached(dg, 2.0)(dp, frozen, batch)
    online = train.drafter_loss(dg, tg, 2.0)(dp, tp, {"tokens": tok2, "anchors": anchors})
    np.testing.assert_allclose(float(cached), float(online), rtol=2e-3)
    b = train.cached_batches(cache, 6, 3, 4, 2, 5, seed=0)
    x, y = b(7), b(7)
    assert x["taps"].shape == (3, 24, 2, 32) and x["taps"].dtype == np.float16 and (x["anchors"] >= 5).all()
    assert all(np.array_equal(x[k], y[k]) for k in x)
    m = train.mixed_batches(b, train.cached_batches(cache, 2, 1, 4, 2, 5, seed=1))(7)
    assert m["tokens"].shape == (4, 24) and np.array_equal(m["tokens"][:3], x["tokens"])


def test_cached_loss_trains_and_epoch_guard_warns(tmp_path, capsys):
    target, drafter = tiny_target(), tiny_drafter((FULL,), block=4)
    dg, dp = nnx.split(drafter)
    stream = np.tile(np.arange(2, 30, dtype=np.int32), 10)
    cache = train.FeatureCache(tmp_path / "f")
    cache.build(target, stream, (0, 2), 24, 8, seed=0, batch=8)
    frozen = {"embed": target.embed_tokens[...], "lm_head": target.unembedding()}
    data = train.cached_batches(cache, 8, 4, 4, 3, 2, seed=0)
    tr = train.Trainer(train.drafter_loss_cached(dg, 2.0), dp, frozen, lambda step: data(0), steps=30,
                       opt=train.OptConfig(lr=1e-2, warmup=3), name="c", log_every=1000)
    losses = tr.run()
    assert losses[-1] < 0.9 * losses[0] and losses[-1] < min(losses[:10]), losses
    e = train.epochs_seen(25, 4, 3, 8, 24 - 4 - 2 + 1)
    assert e == pytest.approx(25 * 4 * 3 / (8 * 19))
    train.warn_epochs("d", 300.0, 20.0)
    train.warn_epochs("d", 0.5, 20.0)
    err = capsys.readouterr().err
    assert err.count("WARNING") == 1 and "300 times" in err


def test_live_loss_equals_the_cached_loss_and_trains(tmp_path):
    """--features live: the target's features made inside the step give the cached loss on the same tokens and
    anchors (taps rounded to float16 alike), depend on the target, and train the drafter."""
    target, drafter = tiny_target(), tiny_drafter((FULL,), block=4)
    tg, tp = nnx.split(target)
    dg, dp = nnx.split(drafter)
    stream = np.random.default_rng(5).integers(2, 320, 200).astype(np.int32)
    cache = train.FeatureCache(tmp_path / "f")
    cache.build(target, stream, (0, 2), 24, 6, seed=3, batch=4)
    toks, greedy, taps = (np.asarray(a) for a in cache.arrays())
    anchors = train.sample_anchors(np.random.default_rng(0), 6, 24, 4, 3, 5)
    frozen = {"embed": target.embed_tokens[...], "lm_head": target.unembedding()}
    cached = train.drafter_loss_cached(dg, 2.0)(dp, frozen, {"tokens": toks, "greedy": greedy, "taps": taps,
                                                             "anchors": anchors})
    live_fn = jax.jit(train.drafter_loss_live(dg, tg, (0, 2), 2.0))
    live = live_fn(dp, {**frozen, "target": tp}, {"tokens": toks, "anchors": anchors})
    np.testing.assert_allclose(float(live), float(cached), rtol=1e-4)
    other = live_fn(dp, {**frozen, "target": nnx.split(tiny_target(seed=1))[1]}, {"tokens": toks, "anchors": anchors})
    assert abs(float(other) - float(cached)) > 1e-3
    tr = train.Trainer(train.drafter_loss_live(dg, tg, (0, 2), 2.0), dp, {**frozen, "target": tp},
                       lambda step: {"tokens": toks[:4], "anchors": anchors[:4]}, steps=30,
                       opt=train.OptConfig(lr=1e-2, warmup=3), name="live", log_every=1000)
    before = tr.evaluate([{"tokens": toks[:4], "anchors": anchors[:4]}])
    losses = tr.run()
    assert before == pytest.approx(losses[0], rel=1e-5)                 # evaluate: the loss, no step taken
    assert losses[-1] < 0.9 * losses[0] and tr.evaluate([{"tokens": toks[:4], "anchors": anchors[:4]}]) < losses[-1]


def test_soft_labels_are_the_target_distribution_at_each_slot():
    """--soft-labels: slot k of the block at anchor a learns the target's next-token distribution at position
    a + k - 1 (the one whose argmax is its greedy label), with the recipe's weights and masks; a weight in between
    mixes the two losses linearly."""
    from jaxspec.model import init_state
    target, drafter = tiny_target(), tiny_drafter((FULL,), block=4)
    tg, tp = nnx.split(target)
    dg, dp = nnx.split(drafter)
    rng = np.random.default_rng(7)
    toks = rng.integers(2, 320, (3, 20)).astype(np.int32)
    anchors = train.sample_anchors(rng, 3, 20, 4, 3, 4)
    frozen = {"embed": target.embed_tokens[...], "lm_head": target.unembedding(), "target": tp}
    batch = {"tokens": toks, "anchors": anchors}
    loss = {a: float(jax.jit(train.drafter_loss_live(dg, tg, (0, 2), 2.0, soft=a))(dp, frozen, batch))
            for a in (0.0, 0.5, 1.0)}
    # the reference, slot by slot, from the target's own forward
    logits, taps, _, _ = target(jnp.asarray(toks), init_state(target.cfg, 3, 20), chain(3, 20), taps=(0, 2))
    p_t = np.asarray(jax.nn.softmax(logits, -1), np.float64)
    greedy = p_t.argmax(-1)
    logq = np.asarray(jax.nn.log_softmax(train.drafter_block_logits(
        drafter, taps.astype(jnp.float16), jnp.asarray(toks), jnp.asarray(anchors), frozen["embed"],
        frozen["lm_head"]), -1), np.float64)                                       # [b, A, B-1, V]
    num = den = 0.0
    for b in range(3):
        for j, a in enumerate(anchors[b]):
            for k in range(1, 4):
                if any(toks[b, a + i] != greedy[b, a + i - 1] for i in range(1, k)):
                    break                                       # past the first slot off the greedy path
                w = np.exp(-(k - 1) / 2.0)
                num += w * -np.sum(p_t[b, a + k - 1] * logq[b, j, k - 1])
                den += w
    assert loss[1.0] == pytest.approx(num / den, rel=1e-4)
    assert loss[0.5] == pytest.approx(0.5 * loss[0.0] + 0.5 * loss[1.0], rel=1e-5)
    assert loss[1.0] != pytest.approx(loss[0.0], rel=1e-3)
    with pytest.raises(ValueError, match="not in"):
        train.drafter_loss_cached(dg, 2.0, soft=1.5)


def test_held_out_batches_are_fixed_chunks_of_the_held_out_rows():
    seen = []
    rows = lambda idx: seen.append(idx) or {"tokens": np.stack([np.full(20, 100 + i) for i in idx])}
    held = train.held_out_batches(rows, 11, 20, 4, 4, 3, 6, seed=2)
    a, b = list(held()), list(held())
    assert len(a) == 2 and [x["tokens"][:, 0].tolist() for x in a] == [[100, 101, 102, 103], [104, 105, 106, 107]]
    assert all(np.array_equal(x["anchors"], y["anchors"]) for x, y in zip(a, b))
    assert all(((x["anchors"] >= 6) & (x["anchors"] <= 16)).all() and x["anchors"].shape == (4, 3) for x in a)
    assert not np.array_equal(a[0]["anchors"], a[1]["anchors"])
    assert list(train.held_out_batches(rows, 3, 20, 4, 4, 3, 6, seed=2)()) == []


def test_held_out_batches_keep_a_last_whole_chunk():
    """n a multiple of the batch: every row in a chunk, none dropped (8 rows of batch 4: rows 0-3 and 4-7)."""
    rows = lambda idx: {"tokens": np.stack([np.full(20, 100 + i) for i in idx])}
    got = list(train.held_out_batches(rows, 8, 20, 4, 4, 3, 6, seed=2)())
    assert [x["tokens"][:, 0].tolist() for x in got] == [[100, 101, 102, 103], [104, 105, 106, 107]]


def test_drafter_subcommand_live_features_with_a_held_out_loss(tmp_path, capsys):
    """`drafter --features live --val-sequences N` on corpus windows: no feature cache on disk, the held-out
    loss before and after in OUT/val_loss.json, and a bad --val-sequences refused naming the flag."""
    from convert.drafter import load_drafter
    from jaxspec.export import export_target
    texts = [f"def h{i}(z):\n    return z - {i}\n\n" * 20 for i in range(30)]
    tok = train.train_tokenizer(texts, 320)
    export_target(tiny_target(), tmp_path / "target")
    train.save_tokenizer(tok, tmp_path / "target")
    (tmp_path / "corpus.py").write_text("".join(texts))
    args = ["drafter", "--target", str(tmp_path / "target"), "--text", str(tmp_path / "corpus.py"), "--out",
            str(tmp_path / "out"), "--mask-token-id", "1", "--block", "4", "--layers", "1", "--heads", "2",
            "--kv-heads", "1", "--head-dim", "16", "--n-taps", "2", "--window", "40", "--windows", "14",
            "--prompt-len", "8", "--batch", "4", "--anchors", "3", "--steps", "12", "--lr", "3e-3",
            "--dtype", "float32", "--features", "live"]
    assert train.main(args + ["--val-sequences", "2"]) == 2
    assert "--val-sequences 2: must be 0 or at least --batch (4)" in capsys.readouterr().err
    assert train.main(args + ["--val-sequences", "12"]) == 2
    assert "--val-sequences 12: the data has 14 sequences" in capsys.readouterr().err
    # greedy data (hours of generation at real sizes): refused before any of it is made
    greedy = args[:-2] + ["--data", "greedy", "--sequences", "6", "--gen-new", "8", "--out", str(tmp_path / "g")]
    assert train.main(greedy + ["--val-sequences", "4"]) == 2
    assert "--val-sequences 4: the data has 6 sequences, and --batch 4" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()
    assert train.main(args + ["--shard-mb", "-1"]) == 2
    assert "--shard-mb -1: must be >= 0" in capsys.readouterr().err
    assert train.main(args + ["--soft-labels", "1.5"]) == 2
    assert "--soft-labels must be in [0, 1], got 1.5" in capsys.readouterr().err
    assert train.main(args[:-2] + ["--soft-labels", "0.5"]) == 2
    assert "--soft-labels 0.5 needs --features live" in capsys.readouterr().err
    assert train.main(args + ["--val-sequences", "8", "--soft-labels", "0.5", "--steps", "4",
                              "--out", str(tmp_path / "soft")]) == 0
    soft = json.loads((tmp_path / "soft" / "val_loss.json").read_text())
    assert train.main(args + ["--val-sequences", "8"]) == 0
    assert not (tmp_path / "out" / "features").exists()
    val = json.loads((tmp_path / "out" / "val_loss.json").read_text())
    assert val["sequences"] == 8 and val["features"] == "live" and [s for s, _ in val["loss_at_step"]] == [0, 12]
    (_, first), (_, last) = val["loss_at_step"]
    assert np.isfinite(first) and 0 < last < first, val                  # it learns what it never saw
    # with soft labels the held-out loss is still the greedy one: the same before training
    assert soft["soft_labels"] == 0.5 and soft["loss_at_step"][0][1] == pytest.approx(first, rel=1e-6)
    assert "held-out" in capsys.readouterr().err
    assert load_drafter(tmp_path / "out" / "drafter", dtype="float32").cfg.block_size == 4


@pytest.mark.slow
def test_drafter_subcommand_on_corpus_data(tmp_path):
    """`python -m jaxspec.train drafter` end to end on a tiny exported target: corpus features cached, trained,
    exported; a rerun reuses the cache."""
    from convert.drafter import load_drafter
    from jaxspec.export import export_target
    texts = [f"def f{i}(x):\n    return x + {i}\n\n" * 20 for i in range(30)]
    tok = train.train_tokenizer(texts, 320)
    target = tiny_target()
    export_target(target, tmp_path / "target")
    train.save_tokenizer(tok, tmp_path / "target")
    (tmp_path / "corpus").mkdir()
    for i in range(0, 30, 10):
        (tmp_path / "corpus" / f"m{i}.py").write_text("".join(texts[i:i + 10]))
    args = ["drafter", "--target", str(tmp_path / "target"), "--text", str(tmp_path / "corpus"), "--out",
            str(tmp_path / "out"), "--mask-token-id", "1", "--block", "4", "--layers", "1", "--heads", "2",
            "--kv-heads", "1", "--head-dim", "16", "--n-taps", "2", "--window", "40", "--windows", "12",
            "--prompt-len", "8", "--batch", "4", "--anchors", "3", "--steps", "4", "--gen-batch", "4",
            "--dtype", "float32"]
    assert train.main(args) == 0
    meta = json.loads((tmp_path / "out" / "features" / "meta.json").read_text())
    assert meta["done"] == meta["windows"] == 12 and meta["window"] == 40
    d = load_drafter(tmp_path / "out" / "drafter", dtype="float32")
    assert d.cfg.block_size == 4 and len(d.cfg.target_layer_ids) == 2
    assert (tmp_path / "out" / "drafter_loss.png").is_file()


def test_greedy_sequences_resume(tmp_path):
    """Generation saved chunk by chunk: a rerun after an interruption makes only the missing sequences (and the
    same ones); other prompts start over."""
    target = tiny_target()
    prompts = np.random.default_rng(0).integers(2, 320, (5, 6)).astype(np.int32)
    path = tmp_path / "g.npy"
    full = train.greedy_sequences(target, prompts, 7, 2, path)
    assert full.shape == (5, 13) and np.array_equal(full[:, :6], prompts)
    assert np.array_equal(np.load(path), full)
    np.save(path, full[:2])                                     # as if stopped after the first chunk
    calls = []
    orig = train.greedy_generate
    train.greedy_generate = lambda m, p, n, b, **kw: calls.append(len(p)) or orig(m, p, n, b, **kw)
    try:
        again = train.greedy_sequences(target, prompts, 7, 2, path)
        assert calls == [2, 1] and np.array_equal(again, full)
        calls.clear()
        other = train.greedy_sequences(target, prompts[::-1].copy(), 7, 2, path)
        assert calls == [2, 2, 1] and np.array_equal(other[:, :6], prompts[::-1])
        # Another target's sequences (same prompts, same shapes) are never resumed from.
        calls.clear()
        np.save(path, other[:2])
        third = train.greedy_sequences(tiny_target(seed=1), prompts[::-1].copy(), 7, 2, path)
        assert calls == [2, 2, 1] and third.shape == other.shape and not np.array_equal(third, other)
    finally:
        train.greedy_generate = orig


def test_greedy_sequences_compile_once(tmp_path, monkeypatch):
    """One engine for all the chunks: its round loop compiles once (an engine per chunk compiled every time,
    ~13 s of each 14 s chunk on the H200)."""
    from jaxspec import engine as E
    made = []

    class Counting(E.Engine):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)
    monkeypatch.setattr(E, "Engine", Counting)
    prompts = np.random.default_rng(1).integers(2, 320, (5, 6)).astype(np.int32)
    out = train.greedy_sequences(tiny_target(), prompts, 4, 2, tmp_path / "g.npy")
    assert out.shape == (5, 10) and len(made) == 1 and made[0]._run._cache_size() == 1


@pytest.mark.slow
def test_drafter_subcommand_on_greedy_data_from_init(tmp_path, monkeypatch, capsys):
    """`drafter --data greedy --init D`: greedy continuations saved and their features cached, training starts
    from D's weights (its architecture, whatever the shape flags say) and exports the same architecture."""
    from convert.drafter import load_drafter
    from jaxspec.export import export_drafter, export_target
    texts = [f"def g{i}(y):\n    return y * {i}\n\n" * 10 for i in range(12)]
    tok = train.train_tokenizer(texts, 320)
    target = tiny_target()
    export_target(target, tmp_path / "target")
    train.save_tokenizer(tok, tmp_path / "target")
    (tmp_path / "text.py").write_text("".join(texts))
    init = tiny_drafter((FULL,), block=4, scale=True)
    export_drafter(init, tmp_path / "init", num_target_layers=target.cfg.num_layers)
    args = ["drafter", "--target", str(tmp_path / "target"), "--text", str(tmp_path / "text.py"), "--out",
            str(tmp_path / "out"), "--init", str(tmp_path / "init"), "--mask-token-id", "7", "--layers", "3",
            "--data", "greedy", "--sequences", "6", "--prompt-len", "8", "--gen-new", "12", "--gen-batch", "4",
            "--batch", "2", "--anchors", "3", "--steps", "1", "--lr", "1e-9", "--dtype", "float32"]
    assert train.main(args) == 0
    seqs = np.load(tmp_path / "out" / "greedy.npy")
    assert seqs.shape == (6, 20)
    meta = json.loads((tmp_path / "out" / "greedy_features" / "meta.json").read_text())
    assert meta["done"] == meta["windows"] == 6 and meta["window"] == 20 and meta["taps"] == [0, 2]
    d = load_drafter(tmp_path / "out" / "drafter", dtype="float32")
    assert d.cfg == init.cfg
    # one step at lr 1e-9 from the init: the weights are the init's, not a fresh drafter's
    for a, b in zip(jax.tree.leaves(nnx.state(d)), jax.tree.leaves(nnx.state(init))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    # --grow-layers 1: the init's layers plus one; without --init it is refused
    grown_args = [a if a != str(tmp_path / "out") else str(tmp_path / "grown") for a in args] + ["--grow-layers", "1"]
    assert train.main(grown_args) == 0
    grown = load_drafter(tmp_path / "grown" / "drafter", dtype="float32")
    assert grown.cfg.num_layers == init.cfg.num_layers + 1
    assert train.main(args[:7] + args[9:] + ["--grow-layers", "1"]) == 2
    bad = tiny_drafter((FULL,), block=4)
    bad_dir = tmp_path / "bad"
    export_drafter(bad, bad_dir, num_target_layers=target.cfg.num_layers)
    cfg = json.loads((bad_dir / "config.json").read_text())
    cfg["hidden_size"] = 2 * cfg["hidden_size"]
    (bad_dir / "config.json").write_text(json.dumps(cfg))
    assert train.main(args[:7] + ["--init", str(bad_dir)] + args[9:]) == 2
    # the held-out evaluation of the pair: every method token-identical to AR, tau >= 1
    res = tmp_path / "eval" / "r.json"
    monkeypatch.setenv("JAXSPEC_LOOP_GRAPHS", "none")     # recorded in the result; JAXSPEC_COMMIT is not a flag
    monkeypatch.setenv("JAXSPEC_COMMIT", "0" * 40)
    assert train.main(["eval", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "out" / "drafter"),
                       "--text", str(tmp_path / "text.py"), "--out", str(res), "--prompts", "2", "--prompt-len", "8",
                       "--max-new", "6", "--budgets", "4"]) == 0
    flags = json.loads(res.read_text())["flags"]
    assert flags["JAXSPEC_LOOP_GRAPHS"] == "none" and "JAXSPEC_COMMIT" not in flags
    m = json.loads(res.read_text())["methods"]
    assert set(m) == {"ar", "dflash", "ddtree_b4"} and m["ar"]["tau"] == 1.0 and m["ar"]["tokens"] == 12
    assert all(m[k]["identical_to_ar"] and m[k]["tau"] >= 1.0 for k in ("dflash", "ddtree_b4"))
    for k, e in m.items():      # the histogram behind tau, and the per-depth acceptance derived from it
        h = np.asarray(e["rounds_by_tokens"])
        assert h.sum() == e["rounds"] and np.isclose((h * np.arange(len(h))).sum() / h.sum(), e["tau"])
        assert e["accept_by_depth"] == train.accept_by_depth(h)
    assert m["ar"]["accept_by_depth"] == []
    # tau in characters: the same continuations for every method, so the same characters, over fewer rounds
    assert m["ar"]["chars"] > 0
    for k, e in m.items():
        assert e["chars"] == m["ar"]["chars"] and np.isclose(e["chars_per_round"], e["tau"] * e["chars"] / e["tokens"])
    conf, agree = m["ar"]["target_confidence"], m["ar"]["depth1_agreement"]
    assert conf["positions"] == 2 * 6 and 1 / 320 <= conf["median_p_max"] <= 1 and 0 <= conf["share_above_0.9"] <= 1
    assert agree["anchors"] == 2 * 5 and np.isclose(sum(x["share"] for x in agree["by_target_p_max"]), 1.0)
    assert np.isclose(sum(x["share"] * (x["agree"] or 0) for x in agree["by_target_p_max"]), agree["all"])
    assert json.loads(res.read_text())["block_size"] == 4 and json.loads(res.read_text())["dirty"] is True
    assert json.loads(res.read_text())["matmul_precision"] == "highest"      # fp32's default: full fp32 products
    # --block-size 3: a chain of 3 (at most 3 tokens a round) and trees at most 2 deep, still identical to AR;
    # and fp32 products as six bf16 ones (--matmul-precision), recorded
    short = tmp_path / "eval" / "short.json"
    assert train.main(["eval", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "out" / "drafter"),
                       "--text", str(tmp_path / "text.py"), "--out", str(short), "--prompts", "2", "--prompt-len", "8",
                       "--max-new", "6", "--budgets", "4", "--block-size", "3",
                       "--matmul-precision", "BF16_BF16_F32_X6"]) == 0
    r3 = json.loads(short.read_text())
    assert r3["matmul_precision"] == "BF16_BF16_F32_X6"
    assert r3["block_size"] == 3 and len(r3["methods"]["dflash"]["rounds_by_tokens"]) == 3 + 1
    assert max(i for i, c in enumerate(r3["methods"]["ddtree_b4"]["rounds_by_tokens"]) if c) <= 3
    assert all(r3["methods"][k]["identical_to_ar"] for k in ("dflash", "ddtree_b4"))
    for bad in ("5", "1"):
        assert train.main(["eval", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "out" / "drafter"),
                           "--text", str(tmp_path / "text.py"), "--out", str(tmp_path / "eval" / "bad.json"),
                           "--block-size", bad]) == 2
        assert f"--block-size {bad}: must be in [2, 4]" in capsys.readouterr().err
    assert not (tmp_path / "eval" / "bad.json").exists()
    assert train.main(["eval", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "out" / "drafter"),
                       "--text", str(tmp_path / "missing.py"), "--out", str(res)]) == 2
    assert train.main(["eval", "--target", str(tmp_path / "target"), "--draft", str(tmp_path / "out" / "drafter"),
                       "--text", str(tmp_path / "text.py"), "--out", str(res), "--prompt-len", "100000"]) == 2


def test_first_draft_agreement_is_what_a_dflash_round_accepts():
    """The eval's depth-1 agreement at the first anchor = whether the first DFlash round accepts a draft."""
    from jaxspec.dflash import DFlash
    from jaxspec.engine import Engine
    target, drafter = tiny_target(), tiny_drafter((FULL,), block=4, scale=True)
    # A head with two live tokens, 5 = +c and 6 = -c, shared by both models: each picks 5 or 6 by the sign
    # of its hidden state along c, so the drafter agrees with the target about half the time.
    assert not target.cfg.tie_word_embeddings
    c = jax.random.normal(jax.random.key(7), (target.cfg.hidden_size,))
    target.lm_head.kernel[...] = jnp.zeros_like(target.lm_head.kernel[...]).at[:, 5].set(c).at[:, 6].set(-c)
    prompts = np.random.default_rng(3).integers(2, 320, (12, 7)).astype(np.int32)
    seqs = train.greedy_generate(target, prompts, 5, 12)
    conf, agree = train.first_draft_agreement(target, drafter, seqs, 7)      # anchor 7: the first round's
    eng = Engine(target, DFlash(drafter, target.cfg, 4), stop_tokens=())
    # Three tokens: prefill's, then the first round's two if it accepted a draft (one round), else one (two rounds).
    accepted = [int(eng.generate([list(map(int, p))], 3).rounds.sum()) == 1 for p in prompts]
    assert agree.shape == (12, 4) and list(agree[:, 0]) == accepted and conf.shape == (12, 12)
    assert 0 < agree[:, 0].mean() < 1          # both outcomes occur, so the comparison means something


def test_accept_by_depth():
    # 31 rounds: 6 emitted 1 token (no draft accepted), 18 emitted 2, 7 emitted 3.
    assert train.accept_by_depth([0, 6, 18, 7]) == [25 / 31, 7 / 25]
    assert train.accept_by_depth([0, 5]) == [] and train.accept_by_depth([0, 0, 4, 0]) == [1.0, 0.0]


def test_repetition_counts_windows_seen_earlier_in_the_same_sequence():
    """`repetition`: the share of the n-token windows ending in the continuation that occurred before, in the
    prompt or earlier in the continuation; other prompts' windows do not count."""
    prompt = np.arange(10, 16)[None]                                           # 6 distinct tokens
    fresh = [list(range(20, 26))]                                              # nothing repeats
    assert train.repetition(prompt, fresh, n=3) == {"n": 3, "mean": 0.0, "share_of_prompts_above_half": 0.0,
                                                    "per_prompt": [0.0]}
    # the continuation copies the prompt: windows (10,11,12) .. (13,14,15) repeat, the two that straddle do not
    r = train.repetition(prompt, [list(range(10, 16))], n=3)
    assert np.isclose(r["mean"], 4 / 6)
    # a loop of period 2 inside the continuation: every window after the first two repeats
    loop = [7, 8] * 5
    r = train.repetition(prompt, [loop], n=3)
    windows = len(loop)                                    # one ends at each continuation token
    assert np.isclose(r["mean"], (windows - 4) / windows) and r["share_of_prompts_above_half"] == 1.0
    # per prompt, then the mean: the second sequence's windows are not "seen" by the first's
    r = train.repetition(np.concatenate([prompt, prompt]), [list(range(10, 16)), list(range(20, 26))], n=3)
    assert np.isclose(r["mean"], (4 / 6 + 0) / 2) and r["share_of_prompts_above_half"] == 0.5
    assert np.allclose(r["per_prompt"], [4 / 6, 0.0])
    # too short to end a window: None for that prompt, left out of the mean, so per_prompt stays aligned
    r = train.repetition(np.concatenate([prompt, prompt])[:, :1], [[1], list(range(20, 26))], n=3)
    assert r["per_prompt"][0] is None and r["per_prompt"][1] == 0.0 and r["mean"] == 0.0


def test_recitation_counts_windows_found_in_a_training_document():
    """`recitation`: the share of the n-token windows ending in the continuation that occur inside one of the
    corpus documents; windows across two documents, or found only in the prompt, do not count."""
    corpus = [np.arange(100, 120), np.arange(200, 210)]
    prompt = np.arange(10, 16)[None]
    assert train.recitation(prompt, [list(range(20, 26))], corpus, n=3) == {
        "n": 3, "mean": 0.0, "share_of_prompts_above_half": 0.0, "per_prompt": [0.0]}
    # six tokens copied from document 0: the two windows that straddle the prompt are not in it, four are
    r = train.recitation(prompt, [list(range(105, 111))], corpus, n=3)
    assert np.isclose(r["mean"], 4 / 6) and r["share_of_prompts_above_half"] == 1.0
    # the end of document 0 then the start of document 1: only the windows inside one document count
    r = train.recitation(prompt, [[117, 118, 119, 200, 201, 202]], corpus, n=3)
    assert np.isclose(r["mean"], 2 / 6)
    # a continuation that copies the prompt recites nothing: the prompt is not training text
    assert train.recitation(prompt, [list(range(10, 16))], corpus, n=3)["mean"] == 0.0
    # per prompt, then the mean; too short to end a window: None, left out of the mean
    # (one-token prompts: the second sequence ends 5 windows, 4 of them inside document 0)
    r = train.recitation(np.concatenate([prompt, prompt])[:, :1], [[1], list(range(105, 111))], corpus, n=3)
    assert r["per_prompt"][0] is None and np.isclose(r["per_prompt"][1], 4 / 5) and np.isclose(r["mean"], 4 / 5)
    # no corpus at all: nothing recited
    assert train.recitation(prompt, [list(range(105, 111))], [], n=3)["mean"] == 0.0


def test_tau_where_weights_prompts_by_their_rounds():
    """`tau_where`: tokens emitted over rounds on the chosen prompts, as tau is over all of them (not the mean of
    the prompts' tau); None when no prompt is chosen."""
    tau, rounds = [4.0, 1.0, 2.0], [10, 40, 20]               # 40, 40 and 40 tokens
    assert np.isclose(train.tau_where(tau, rounds, [True, True, True]), 120 / 70)
    assert np.isclose(train.tau_where(tau, rounds, [True, False, True]), 80 / 30)
    assert train.tau_where(tau, rounds, [False, False, False]) is None


def test_grow_drafter_drafts_as_before_and_trains_the_new_layers():
    """--grow-layers: appended layers start as the identity (the drafts are the old drafter's), and the
    gradient reaches them."""
    d = tiny_drafter((FULL, SLIDING), block=4, scale=True)
    target = tiny_target()
    g = train.grow_drafter(d, 2, seed=5)
    assert g.cfg.layer_types == (FULL, SLIDING, SLIDING, SLIDING) and g.cfg.num_layers == 4
    taps = jax.random.normal(jax.random.key(0), (2, 7, 2, d.cfg.hidden_size))
    embed, head = target.embed_tokens[...], target.unembedding()
    anchor = jnp.asarray([3, 9], jnp.int32)

    def draft(m):
        return m.draft(m.add_context(m.init_cache(2, 16), taps, jnp.asarray([7, 5])), anchor, embed, head)[0]
    np.testing.assert_allclose(draft(g), draft(d), rtol=1e-6, atol=1e-6)
    # The check can fail: one new layer that is not the identity changes the drafts.
    h = train.grow_drafter(d, 2, seed=5)
    o = h.layers[3].self_attn.o_proj
    o.kernel[...] = 0.3 * jax.random.normal(jax.random.key(2), o.kernel[...].shape)
    assert float(jnp.abs(draft(h) - draft(d)).max()) > 1e-3
    gd, gp = nnx.split(g)
    w = jax.random.normal(jax.random.key(1), draft(g).shape)
    grads = jax.grad(lambda p: jnp.sum(draft(nnx.merge(gd, p)) * w))(gp)
    for layer in (2, 3):
        for kernel in (grads["layers"][layer]["self_attn"]["o_proj"]["kernel"],
                       grads["layers"][layer]["mlp"]["down_proj"]["kernel"]):
            assert float(jnp.abs(kernel[...]).max()) > 0


# ------------------------------------------------------------------------------------------------
# The loop


def _drafter_trainer(tmp_path=None, steps=40, fixed=True):
    target, drafter = tiny_target(), tiny_drafter((FULL,), block=4)
    tg, tp = nnx.split(target)
    dg, dp = nnx.split(drafter)
    rng = np.random.default_rng(0)
    seqs = rng.integers(2, 320, (8, 24)).astype(np.int32)
    seqs[:, 1::2] = seqs[:, 0::2]      # learnable structure: every odd token repeats the one before
    data = train.drafter_batches(seqs, 1, 4, 4, 3, seed=0)
    batch_at = (lambda step: data(0)) if fixed else data
    return train.Trainer(train.drafter_loss(dg, tg, 2.0), dp, tp, batch_at, steps=steps,
                         opt=train.OptConfig(lr=1e-2, warmup=3), ckpt_dir=tmp_path, ckpt_every=0, name="t",
                         log_every=1000)


def test_loss_decreases_on_a_fixed_batch():
    tr = _drafter_trainer(steps=30)
    losses = tr.run()
    assert len(losses) == 30 and losses[-1] < 0.9 * losses[0] and losses[-1] < min(losses[:10]), losses


@pytest.mark.slow
def test_target_loss_decreases():
    target = tiny_target()
    g, p = nnx.split(target)
    stream = np.tile(np.arange(2, 40, dtype=np.int32), 50)
    tr = train.Trainer(train.target_loss(g), p, (), train.stream_batches(stream, 4, 32, 0), steps=25,
                       opt=train.OptConfig(lr=1e-2, warmup=3), name="lm", log_every=1000)
    losses = tr.run()
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.slow
def test_resume_gives_the_same_next_step(tmp_path):
    ref = _drafter_trainer(steps=6, fixed=False)
    ref.run()
    first = _drafter_trainer(tmp_path / "ck", steps=6, fixed=False)
    first.run(max_steps=4)                           # "interrupted" after 4 steps; saved on exit
    assert first.step == 4
    again = _drafter_trainer(tmp_path / "ck", steps=6, fixed=False)
    assert again.restore() and again.step == 4 and again.losses == first.losses
    again.run()
    np.testing.assert_allclose(again.losses, ref.losses, rtol=1e-6)
    for x, y in zip(jax.tree.leaves(again.params), jax.tree.leaves(ref.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_adamw_schedule():
    o = train.OptConfig(lr=1.0, warmup=10, min_lr_frac=0.1)
    assert float(train.lr_at(0, 100, o)) == pytest.approx(0.1)
    assert float(train.lr_at(9, 100, o)) == pytest.approx(1.0)
    assert float(train.lr_at(100, 100, o)) == pytest.approx(0.1)


def test_adamw_schedule_decays_on_a_cosine_after_the_warm_up():
    """lr_at after the warm-up (OptConfig's comment: cosine decay to lr x min_lr_frac at `steps`): the peak at step
    `warmup`, then min + (peak - min) x (1 + cos(pi x (step - warmup) / (steps - warmup))) / 2."""
    o = train.OptConfig(lr=2.0, warmup=10, min_lr_frac=0.1)
    assert float(train.lr_at(10, 100, o)) == pytest.approx(2.0, rel=1e-6)
    for step in (25, 55, 80):
        want = 0.2 + (2.0 - 0.2) * 0.5 * (1 + np.cos(np.pi * (step - 10) / 90))
        assert float(train.lr_at(step, 100, o)) == pytest.approx(want, rel=1e-6), step


def test_adamw_clips_decays_matrices_only_and_corrects_bias():
    """Two AdamW steps against numpy: the gradients clipped to global norm `clip` (here 5 -> 1), decoupled weight
    decay on the matrix but not on the vector, m and v divided by 1 - b^t, and lr_at's schedule."""
    o = train.OptConfig(lr=0.1, warmup=2, min_lr_frac=0.1, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.5, clip=1.0)
    params = {"b": np.array([1.0, -2.0], np.float32), "w": np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)}
    grads = [{"b": np.array([3.0, 0.0], np.float32), "w": np.array([[0.0, 4.0], [0.0, 0.0]], np.float32)},   # |g| 5
             {"b": np.array([0.1, -0.2], np.float32), "w": np.array([[0.2, 0.0], [-0.1, 0.3]], np.float32)}]
    steps = 10
    got, opt = jax.tree.map(jnp.asarray, params), train.adamw_init(params)
    want = {k: v.astype(np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in want.items()}
    v = {k: np.zeros_like(x) for k, x in want.items()}
    for step, g in enumerate(grads):
        got, opt, gnorm, lr = train.adamw_update(got, jax.tree.map(jnp.asarray, g), opt, step, steps, o)
        norm = np.sqrt(sum(np.sum(np.square(x.astype(np.float64))) for x in g.values()))
        scale = min(1.0, o.clip / (norm + 1e-6))
        frac = min(max((step - o.warmup) / (steps - o.warmup), 0.0), 1.0)
        want_lr = o.lr * min((step + 1) / o.warmup, 1.0) * (
            o.min_lr_frac + (1 - o.min_lr_frac) * 0.5 * (1 + np.cos(np.pi * frac)))
        t = step + 1
        for k in want:
            gk = g[k] * scale
            m[k] = o.b1 * m[k] + (1 - o.b1) * gk
            v[k] = o.b2 * v[k] + (1 - o.b2) * gk ** 2
            u = (m[k] / (1 - o.b1 ** t)) / (np.sqrt(v[k] / (1 - o.b2 ** t)) + o.eps)
            decay = o.weight_decay * want[k] if want[k].ndim >= 2 else 0.0
            want[k] = want[k] - want_lr * (u + decay)
        assert float(gnorm) == pytest.approx(norm, rel=1e-6) and float(lr) == pytest.approx(want_lr, rel=1e-6)
        for k in want:
            np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-5, atol=1e-6, err_msg=f"{k} step {t}")
    assert norm < o.clip             # the 2nd step unclipped: its m and v mix clipped and unclipped gradients


def _quadratic_trainer(ck, batch_at, steps=10, ckpt_every=2):
    """A Trainer of one 2x2 matrix whose loss is sum(w^2) x batch["s"][0]: steps in milliseconds."""
    return train.Trainer(lambda p, frozen, b: jnp.sum(p["w"] ** 2) * b["s"][0], {"w": jnp.ones((2, 2))}, (),
                         batch_at, steps=steps, opt=train.OptConfig(lr=0.1, warmup=1), ckpt_dir=ck,
                         ckpt_every=ckpt_every, log_every=1, name="t")


@pytest.mark.parametrize("rows,devices", [(4, 4), (6, 6), (3, 3), (16, 8)])
def test_batches_are_split_over_the_most_devices_that_divide_them(rows, devices):
    """Data parallel over the tests' 8 CPU devices: a batch of `rows` is split on the mesh's "data" axis over the
    most devices that divide it, one equal slice each, and the step's loss is the unsplit batch's (numpy)."""
    assert jax.device_count() == 8
    x = np.random.default_rng(rows).standard_normal((rows, 3)).astype(np.float32)
    w0 = np.arange(6, dtype=np.float32).reshape(3, 2) / 6
    tr = train.Trainer(lambda p, frozen, b: jnp.mean(jnp.sum((b["x"] @ p["w"]) ** 2, -1)), {"w": jnp.asarray(w0)},
                       (), lambda step: {"x": x}, steps=2, opt=train.OptConfig(lr=0.1, warmup=1), ckpt_dir=None,
                       log_every=1, name="dp")
    assert tr.mesh.size == devices
    batch = tr._load(0)
    assert {s.data.shape for s in batch["x"].addressable_shards} == {(rows // devices, 3)}
    assert len({s.device for s in batch["x"].addressable_shards}) == devices
    loss = float(tr.run_step(batch))
    assert loss == pytest.approx(float(np.mean(np.sum((x @ w0) ** 2, -1))), rel=1e-5)


def test_the_trainers_own_warm_up_is_used_and_resumed(tmp_path):
    """A warm-up set on the Trainer (as calibration and restore set it) rather than its OptConfig's: each step's
    learning rate is lr_at's with that warm-up, and a run interrupted after 3 steps and resumed into a fresh Trainer
    gives the uninterrupted run's losses."""
    batch_at = lambda step: {"s": np.ones((1,), np.float32)}
    tr = _quadratic_trainer(None, batch_at)
    tr.warmup = 5                                              # the OptConfig's is 1
    for step in range(3):
        tr.run_step()
        want = float(train.lr_at(step, 10, train.OptConfig(lr=0.1, warmup=5)))
        assert float(tr._last[2]) == pytest.approx(want, rel=1e-6) and want < 0.1
    ref = _quadratic_trainer(tmp_path / "ref", batch_at, ckpt_every=0)
    ref.warmup = 5
    ref.run()
    first = _quadratic_trainer(tmp_path / "ck", batch_at, ckpt_every=0)
    first.warmup = 5
    first.run(max_steps=3)                                     # "interrupted"; saved on exit
    again = _quadratic_trainer(tmp_path / "ck", batch_at, ckpt_every=0)
    assert again.restore() and again.step == 3 and again.warmup == 5
    again.run()
    np.testing.assert_allclose(again.losses, ref.losses, rtol=1e-6)


def test_a_diverged_run_keeps_its_last_good_checkpoint(tmp_path, capsys):
    """A non-finite loss (step 5 here) raises FloatingPointError and saves nothing more: the run's exit saved the
    NaN params as the newest checkpoint, which a rerun resumed, and with Orbax's max_to_keep 2 the good ones were
    deleted. Params that are not finite are not saved either."""
    ck = tmp_path / "ck"
    batch_at = lambda step: {"s": np.full((1,), np.nan if step == 4 else 1.0, np.float32)}
    ckpts = lambda: sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit())
    tr = _quadratic_trainer(ck, batch_at)
    with pytest.raises(FloatingPointError, match="t: loss nan at step 5"):
        tr.run()
    assert ckpts() == [2, 4] and sorted(p.name for p in (ck / "meta").iterdir()) == ["2.json", "4.json"]
    assert "t: not saving step 5: training diverged at step 5" in capsys.readouterr().err
    again = _quadratic_trainer(ck, batch_at)
    assert again.restore() and again.step == 4 and np.isfinite(np.asarray(again.params["w"])).all()
    with pytest.raises(FloatingPointError, match="at step 5"):
        again.run()
    assert ckpts() == [2, 4]
    ok = _quadratic_trainer(ck, lambda step: {"s": np.ones((1,), np.float32)})
    assert ok.restore() and ok.step == 4
    ok.params = {"w": ok.params["w"] * np.nan}                 # params gone NaN with a finite loss
    ok.step = 6
    ok.save()
    assert ckpts() == [2, 4] and "not saving step 6: training diverged at step 6" in capsys.readouterr().err


def test_calibration_probe_saves_nothing_and_leaves_no_state(tmp_path):
    """calibrate_steps's probe (--time-budget-s) writes no checkpoint (its periodic saves recorded the uncalibrated
    schedule, and a kill after it resumed them), and the trainer is rewound, so the calibrated run is a plain run of
    that many steps; a Ctrl-C in the probe saves nothing, as Interrupted says."""
    import signal
    batch_at = lambda step: {"s": np.full((1,), 1.0 + 0.1 * step, np.float32)}
    tr = _quadratic_trainer(tmp_path / "ck", batch_at, steps=10_000)
    n = train.calibrate_steps(tr, 1.0, probe=4, cap=8)
    assert n == 8 and tr.step == 0 and tr.losses == [] and not (tmp_path / "ck").exists()
    np.testing.assert_array_equal(np.asarray(tr.params["w"]), np.ones((2, 2)))
    tr.steps, tr.warmup = n, 1
    plain = _quadratic_trainer(tmp_path / "plain", batch_at, steps=n)
    assert tr.run() == plain.run()
    np.testing.assert_array_equal(np.asarray(tr.params["w"]), np.asarray(plain.params["w"]))
    probed = _quadratic_trainer(tmp_path / "ck2", batch_at, steps=10_000)
    step_fn = probed._step_fn

    def step(*args):
        out = step_fn(*args)
        if int(args[4]) == 3:
            signal.raise_signal(signal.SIGINT)
        return out
    probed._step_fn = step
    with pytest.raises(train.Interrupted, match="interrupted at step 4; no checkpoint saved") as e:
        train.calibrate_steps(probed, 1.0, probe=6)
    assert e.value.saved is None and not (tmp_path / "ck2").exists()


# ------------------------------------------------------------------------------------------------
# Export -> load round trips, PNG


def _bits(model):
    return {p: np.ascontiguousarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))}


def assert_same_bits(model, back):
    """`back` holds `model`'s params bit for bit: the same paths, dtypes, shapes and bytes."""
    a, b = _bits(model), _bits(back)
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k].dtype, a[k].shape) == (b[k].dtype, b[k].shape), k
        assert np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)), k


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_target_round_trips_exactly(tmp_path, dtype):
    from convert.hf import load_target
    from jaxspec.export import export_target
    model = tiny_target(3, dtype)
    export_target(model, tmp_path, max_shard_bytes=20_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1            # sharded
    back = load_target(tmp_path)
    assert back.cfg == model.cfg
    assert_same_bits(model, back)
    # The context limit (outside cfg's ==) round-trips too: none (0) stays none, a limit stays that limit.
    assert model.cfg.max_position_embeddings == back.cfg.max_position_embeddings == 0
    limited = Qwen35(model.cfg.replace(max_position_embeddings=777), rngs=nnx.Rngs(0))
    export_target(limited, tmp_path / "limited")
    assert load_target(tmp_path / "limited").cfg.max_position_embeddings == 777


def test_export_target_gives_transformers_the_same_model(tmp_path):
    """An exported target read by transformers' own loader (not jaxspec's): its logits are jaxspec's, with every
    norm, A_log and dt_bias moved off its initial value so that a layout or convention slip would show."""
    import torch
    from transformers import AutoModelForCausalLM
    from jaxspec.export import export_target
    model = tiny_target(4)
    rng = np.random.default_rng(4)
    for path, v in nnx.to_flat_state(nnx.state(model)):
        if any(w in "/".join(map(str, path)) for w in ("norm", "A_log", "dt_bias")):
            v.set_value(v.get_value() + jnp.asarray(0.3 * rng.standard_normal(v.get_value().shape), jnp.float32))
    export_target(model, tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    tokens = rng.integers(0, model.cfg.vocab_size, (2, 11))
    with torch.no_grad():
        want = hf(torch.tensor(tokens)).logits.numpy()
    got = np.asarray(model(jnp.asarray(tokens, jnp.int32), model.init_state(2, 16), chain(2, 11))[0])
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_export_drafter_round_trips_exactly(tmp_path):
    from convert.drafter import load_drafter
    from jaxspec.export import export_drafter
    model = tiny_drafter((SLIDING, FULL), window=5, dtype="bfloat16", scale=True)
    export_drafter(model, tmp_path, num_target_layers=4)
    back = load_drafter(tmp_path)
    assert back.cfg == model.cfg
    assert_same_bits(model, back)


def test_export_drafter_in_shards_round_trips_exactly(tmp_path):
    """max_shard_bytes: a drafter larger than that goes to shards of at most that size plus an index (the demo pair's
    files must be <= 16 MB); the loader reads them back bit for bit, and refuses an index whose shard is gone."""
    from convert.drafter import load_drafter
    from convert.hf import CheckpointError
    from jaxspec.export import export_drafter
    model = tiny_drafter((SLIDING, FULL), window=5, dtype="bfloat16", scale=True)
    limit = 4096
    export_drafter(model, tmp_path / "one", num_target_layers=4, max_shard_bytes=10 ** 9)
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["config.json", "model.safetensors"]
    export_drafter(model, tmp_path / "sharded", num_target_layers=4)             # an earlier export, one file
    export_drafter(model, tmp_path / "sharded", num_target_layers=4, max_shard_bytes=limit)
    shards = sorted((tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 2 and not (tmp_path / "sharded" / "model.safetensors").exists()
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [p.name for p in shards]
    from safetensors import safe_open
    for p in shards:
        with safe_open(str(p), framework="numpy") as f:
            keys = list(f.keys())
            assert len(keys) == 1 or sum(f.get_tensor(k).nbytes for k in keys) <= limit
    back = load_drafter(tmp_path / "sharded")
    assert back.cfg == model.cfg
    export_drafter(model, tmp_path / "again", num_target_layers=4, max_shard_bytes=limit)
    export_drafter(model, tmp_path / "again", num_target_layers=4)                # and back to one file
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == ["config.json", "model.safetensors"]
    assert_same_bits(model, back)
    shards[1].unlink()
    with pytest.raises(CheckpointError, match=f"missing.*{shards[1].name}"):
        load_drafter(tmp_path / "sharded")


def test_write_atomic_leaves_the_old_file_whole(tmp_path, monkeypatch):
    from jaxspec import files
    f = tmp_path / "curve.png"
    files.write_atomic(f, b"old")
    files.write_atomic(f, "new text")
    assert f.read_text() == "new text"

    def fail(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        files.write_atomic(f, b"newer")
    assert f.read_text() == "new text" and [p.name for p in tmp_path.iterdir()] == ["curve.png"]


def _png_pixels(data: bytes) -> np.ndarray:
    """The [400, 640, 3] pixels of a loss_curve_png PNG (one IDAT chunk, every row of filter 0)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    idat = data.index(b"IDAT")
    n = int.from_bytes(data[idat - 4:idat], "big")
    raw = zlib.decompress(data[idat + 4:idat + 4 + n])
    assert len(raw) == 400 * (1 + 640 * 3)
    rows = np.frombuffer(raw, np.uint8).reshape(400, 1 + 640 * 3)
    assert not rows[:, 0].any()
    return rows[:, 1:].reshape(400, 640, 3)


def test_loss_curve_png(tmp_path):
    """The PNG shows the curve: blue in every column of the plot area (left 60, right 10, top 10, bottom 30 px), high
    where the loss is high; the smoothed curve in dark blue; and another curve gives another image."""
    from jaxspec.plot import loss_curve_png
    down = np.exp(-np.arange(200) / 50) + 0.1 * np.random.default_rng(0).random(200)
    loss_curve_png(tmp_path / "c.png", list(down))
    img = _png_pixels((tmp_path / "c.png").read_bytes()).astype(int)
    area = img[10:370, 61:631]                                       # inside the axes
    blue = (area[..., 2] > area[..., 0] + 40)                        # the raw (light) and smoothed (dark) curves
    assert blue.any(0).all(), "a column of the plot area has no curve"
    assert (np.abs(area - (20, 40, 160)).sum(-1) == 0).sum() > 300    # the smoothed curve
    rows = [np.flatnonzero(blue[:, x]).mean() for x in range(blue.shape[1])]
    assert np.mean(rows[:20]) < 60 and np.mean(rows[-20:]) > 250, (np.mean(rows[:20]), np.mean(rows[-20:]))
    loss_curve_png(tmp_path / "up.png", list(down[::-1]))
    up = _png_pixels((tmp_path / "up.png").read_bytes()).astype(int)[10:370, 61:631]
    assert (up != area).any(-1).sum() > 1000


def test_help():
    with pytest.raises(SystemExit) as e:
        train.main(["--help"])
    assert e.value.code == 0


@pytest.mark.slow
def test_pair_tiny_end_to_end(tmp_path):
    """The whole pipeline at toy sizes: outputs, results, and the exported pair runs in generate."""
    import subprocess
    import sys
    import tarfile
    out = tmp_path / "out"
    assert train.main(["pair", "--tiny", "--out", str(out), "--time-budget-s", "120"]) == 0
    res = json.loads((out / "results.json").read_text())
    m = res["eval"]["methods"]
    assert m["ar"]["tau"] == 1.0 and m["dflash"]["identical_to_ar"] and m["dflash"]["tau"] >= 1.0
    assert m["dflash"]["chars"] == m["ar"]["chars"] > 0 and m["dflash"]["chars_per_round"] >= m["ar"]["chars_per_round"]
    assert any(k.startswith("ddtree") for k in m)
    assert 0.0 <= m["ar"]["recitation"]["mean"] <= 1.0 and m["dflash"]["not_reciting"]["max_share"] == train.FRESH
    files = [p for p in out.iterdir() if p.is_file()]
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 for p in files)
    demo = tmp_path / "unpacked"
    demo.mkdir()
    (tmp_path / "pair.tar").write_bytes(b"".join(p.read_bytes() for p in sorted(out.glob("pair.tar.*"))))
    with tarfile.open(tmp_path / "pair.tar") as tf:
        tf.extractall(demo, filter="data")
    env = dict(__import__("os").environ, JAXSPEC_DEMO_DIR=str(demo / "demo"), JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-m", "jaxspec.generate", "--max-new-tokens", "12"], capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "speedup" in r.stderr and "ddtree" in r.stderr


@pytest.mark.slow
def test_pair_without_eval_still_trains_exports_and_packs(tmp_path):
    """--no-eval: no held-out evaluation (the drafter may train until 95% of the budget instead of 74%); the
    pair is still trained, exported and packed, with the data and drafter sizes the flags ask for."""
    out = tmp_path / "out"
    t0 = time.time()
    assert train.main(["pair", "--tiny", "--out", str(out), "--time-budget-s", "50", "--no-eval",
                       "--target-max-epochs", "0.5", "--gen-sequences", "8", "--drafter-layers", "2",
                       "--vocab", "300", "--package-text", "2", "--target-share", "0.5"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["corpus"]["vocab"] == 300 and res["target"]["config"]["vocab_size"] == 300    # --vocab (tiny: 320)
    assert res["drafter"]["config"]["vocab_size"] == 300
    assert 0 < res["drafter_data"]["greedy"]["sequences"] <= 8                  # --gen-sequences (tiny: 16)
    assert len(res["drafter"]["config"]["layer_types"]) == 2                   # --drafter-layers (tiny: 1)
    assert "methods" not in res["eval"] and "--no-eval" in res["eval"]["skipped"]
    assert 0 < res["target"]["epochs"] <= 0.5 and res["target"]["max_epochs"] == 0.5
    assert res["target"]["share_of_budget"] == 0.5
    c = res["corpus"]                     # the drafter's prompts: files neither trained on nor evaluated on
    assert c["drafter_prompts"] == "unseen" and c["package_files"] == {"target": 2, "drafter_prompts": 2}
    names = c["stdlib_files"]                                                # --package-text 2: 2 + 2 files
    assert c["drafter_prompt_files"] == len(names["drafter_prompts"]) + 2 and 0 < len(names["drafter_prompts"])
    assert c["train_files"] == len(names["train"]) + 2 and c["held_out_files"] == len(names["held_out"])
    assert not set(names["train"]) & (set(names["held_out"]) | set(names["drafter_prompts"]))
    root = Path(sysconfig.get_paths()["stdlib"])                            # what eval --unseen-by leaves out
    some = [root / n for n in names["train"][:2] + names["held_out"][:2] + names["drafter_prompts"][:1]]
    assert train.seen_by_pair(some, res) == some[:2] + some[4:]
    assert res["drafter"]["steps"] > 0 and sorted(out.glob("pair.tar.*"))
    assert time.time() - t0 < 50 * 1.15 + 30            # the budget, plus the export and packing


# a `pair` of a few seconds a phase: no evaluation, corpus data only (no greedy continuations to make)
FAST_PAIR = ["pair", "--tiny", "--no-eval", "--time-budget-s", "2", "--drafter-data", "corpus", "--ckpt-every", "0"]


@pytest.fixture(scope="module")
def fast_pair(tmp_path_factory):
    """One FAST_PAIR run, its target and drafter phases each with a checkpoint: the tests rerun copies of it."""
    out = tmp_path_factory.mktemp("fast_pair") / "out"
    assert train.main([*FAST_PAIR, "--out", str(out)]) == 0
    return out


def _copy_of(out: Path, tmp_path: Path) -> Path:
    import shutil
    shutil.copytree(out, tmp_path / "out")
    return tmp_path / "out"


def test_pair_rerun_keeps_a_deadline_cut_target_once_the_drafter_has_begun(fast_pair, tmp_path, capsys):
    """A target cut short by its deadline (fewer steps than scheduled) is not trained further by a rerun once the
    drafter phase has a checkpoint (the rerun's new deadline trained it on, and the resumed drafter continued against
    another target, silently): it is kept as it was, said in one line, and the drafter resumes. The drafter's
    checkpoints record the exported target's fingerprint, the same each time those files are read."""
    from convert.hf import load_target
    out = _copy_of(fast_pair, tmp_path)
    work = out / "work"
    (meta_f,) = (work / "ckpt_target" / "meta").glob("*.json")
    meta = json.loads(meta_f.read_text())
    n = meta["step"]
    meta_f.write_text(json.dumps({**meta, "steps": n + 20}))         # as a target cut short by its deadline leaves it
    weights = {f.name: f.read_bytes() for f in (work / "pair" / "target").glob("*.safetensors")}
    capsys.readouterr()
    assert train.main([*FAST_PAIR, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"target: kept at step {n}/{n + 20}: the drafter phase has begun" in err, err
    assert f"drafter: resumed from {work / 'ckpt_drafter'}" in err
    assert json.loads((out / "results.json").read_text())["target"]["steps"] == n
    assert [p.name for p in (work / "ckpt_target" / "meta").iterdir()] == [f"{n}.json"]
    assert weights and {f.name: f.read_bytes() for f in (work / "pair" / "target").glob("*.safetensors")} == weights
    fingerprint = train.model_fingerprint(load_target(work / "pair" / "target", dtype="float32"))
    assert train.model_fingerprint(load_target(work / "pair" / "target", dtype="float32")) == fingerprint
    assert train.newest_meta(work / "ckpt_drafter")["config"]["the target (its weights)"] == fingerprint


def test_pair_rerun_keeps_the_data_a_drafter_checkpoint_was_trained_on(fast_pair, tmp_path, capsys):
    """Once the drafter has a checkpoint, a rerun does not extend its deadline-cut feature cache (4 -> 8 windows:
    the resumed drafter trained on other data than its checkpoint's, and results.json misreported it): the cache is
    kept, said in one line, and the data's size is in the checkpoint's config."""
    out = _copy_of(fast_pair, tmp_path)
    work = out / "work"
    done = json.loads((work / "features" / "meta.json").read_text())["done"]
    before = json.loads((out / "results.json").read_text())["drafter_data"]
    capsys.readouterr()
    assert train.main([*FAST_PAIR, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"features: kept at {done}/" in err and f"drafter: resumed from {work / 'ckpt_drafter'}" in err, err
    assert json.loads((work / "features" / "meta.json").read_text())["done"] == done
    after = json.loads((out / "results.json").read_text())["drafter_data"]
    assert after["corpus"]["windows"] == before["corpus"]["windows"] == done and after["epochs"] == before["epochs"]
    assert train.newest_meta(work / "ckpt_drafter")["config"]["the drafter's data (sequences)"] == [done]


def test_pair_rerun_refuses_a_drafter_checkpoint_made_against_other_target_weights(fast_pair, tmp_path, capsys):
    """A drafter checkpoint whose target weights (their fingerprint) are not those of the exported target is refused
    naming old -> new (exit 2), never trained on against the other target."""
    from convert.hf import load_target
    out = _copy_of(fast_pair, tmp_path)
    work = out / "work"
    (meta_f,) = (work / "ckpt_drafter" / "meta").glob("*.json")
    meta = json.loads(meta_f.read_text())
    other = {**meta["config"], "the target (its weights)": "0123456789abcdef"}     # made against another target
    meta_f.write_text(json.dumps({**meta, "config": other}))
    fingerprint = train.model_fingerprint(load_target(work / "pair" / "target", dtype="float32"))
    capsys.readouterr()
    assert train.main([*FAST_PAIR, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"the target (its weights): 0123456789abcdef -> {fingerprint}. Pass a new --out (or --work)" in err, err
    assert "drafter: resumed" not in err


def test_pair_rerun_refuses_another_target_max_epochs(fast_pair, tmp_path, capsys):
    """--target-max-epochs shapes the target's schedule: a rerun with another one is refused naming old -> new (it
    resumed the old schedule and trained past the new cap, recording the new one in results.json)."""
    out = _copy_of(fast_pair, tmp_path)
    capsys.readouterr()
    assert train.main([*FAST_PAIR, "--out", str(out), "--target-max-epochs", "0.0001"]) == 2
    err = capsys.readouterr().err
    assert "--target-max-epochs: 0 -> 0.0001" in err and "Traceback" not in err, err


def test_pair_rerun_refuses_a_drafter_checkpoint_whose_targets_checkpoints_are_gone(fast_pair, tmp_path, capsys):
    """A drafter checkpoint without the target's checkpoints is refused at once (exit 2, naming both dirs), before a
    new target is trained that the drafter's checkpoint would only be refused against."""
    import shutil
    out = _copy_of(fast_pair, tmp_path)
    work = out / "work"
    shutil.rmtree(work / "ckpt_target")
    capsys.readouterr()
    assert train.main([*FAST_PAIR, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{work / 'ckpt_drafter'} holds a drafter trained against a target whose checkpoints are not in " in err, err
    assert "target: step" not in err and not [p for p in (work / "ckpt_target").iterdir() if p.name.isdigit()]


def test_phase_ends_move_the_target_and_squeeze_the_rest():
    """--target-share: the default leaves PHASE_END as it is; a larger share ends the target there and keeps
    the later phases in order, in their proportions, before 0.95; out of range is refused."""
    assert train.phase_ends() == pytest.approx(train.PHASE_END)
    e = train.phase_ends(0.75)
    order = ["target", "corpus_mixed", "corpus_corpus", "greedy", "drafter", "drafter_no_eval"]
    assert e["target"] == 0.75 and e["drafter_no_eval"] == pytest.approx(0.95)
    assert [e[k] for k in order] == sorted(e[k] for k in order)
    base = train.PHASE_END
    ratio = (e["greedy"] - e["corpus_mixed"]) / (base["greedy"] - base["corpus_mixed"])
    assert ratio == pytest.approx((0.95 - 0.75) / (0.95 - base["target"]))
    for bad in (0.1, 0.9, 1.2):
        with pytest.raises(ValueError, match="must be in"):
            train.phase_ends(bad)


def test_pair_sizes_resize_the_target_and_the_drafter_follows():
    """--target-width / --target-layers: heads, GDN heads and FFN scale with the width, the head dims stay,
    every 4th layer stays full attention, the drafter follows the width and its taps the depth."""
    base = train.full_sizes()
    assert train.resized(base) == base                                       # no flags: the shipped sizes
    s = train.resized(base, 512, 12)
    t = s.target
    assert (t.hidden_size, t.intermediate_size, t.num_layers) == (512, 1536, 12)
    assert (t.num_heads, t.num_kv_heads, t.head_dim) == (8, 4, 64)
    assert (t.linear_num_key_heads, t.linear_num_value_heads, t.linear_key_head_dim) == (8, 16, 32)
    assert [i for i, lt in enumerate(t.layer_types) if lt == "full_attention"] == [3, 7, 11]
    dcfg = train.make_drafter_config(s, t, mask_id=4095)
    assert dcfg.hidden_size == 512 and dcfg.num_heads * dcfg.head_dim == 512 and dcfg.intermediate_size == 1536
    assert len(s.taps) == len(base.taps) and max(s.taps) < 12 and s.taps == train.spread_taps(12, 3)
    assert train.spread_taps(8, 3) == base.taps == (1, 4, 6)
    assert train.resized(base, layers=8).taps == base.taps and train.resized(base, 384).target.num_heads == 6


@pytest.mark.parametrize("flags,message", [(["--target-width", "300"], "--target-width 300"),
                                           (["--target-layers", "3"], "--target-layers 3"),
                                           (["--target-max-epochs", "-1"], "--target-max-epochs -1"),
                                           (["--target-share", "0.92"], "--target-share 0.92"),
                                           (["--target-share", "0.1"], "--target-share 0.1"),
                                           (["--gen-sequences", "0"], "--gen-sequences 0"),
                                           (["--gen-batch", "-4"], "--gen-batch -4"),
                                           (["--drafter-layers", "0"], "--drafter-layers 0"),
                                           (["--vocab", "100"], "--vocab 100"),
                                           (["--package-text", "-1"], "--package-text -1"),
                                           (["--package-text", str(10 ** 9)], "--package-text 1000000000"),
                                           (["--part-mb", "0"], "--part-mb 0: must be >= 1"),
                                           (["--time-budget-s", "-1"], "--time-budget-s -1: must be > 0"),
                                           (["--ckpt-every", "-1"], "--ckpt-every -1: must be >= 0"),
                                           (["--seed", "-1"], "--seed -1: must be >= 0"),
                                           (["--target-width", "0"], "--target-width 0: must be >= 1"),
                                           (["--target-layers", "0"], "--target-layers 0: must be >= 1")])
def test_pair_refuses_sizes_by_flag(tmp_path, capsys, flags, message):
    assert train.main(["pair", "--tiny", "--out", str(tmp_path / "o"), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()                                     # refused before anything is written


def test_training_differentiates_the_jnp_ops_where_kernels_would_run(monkeypatch):
    """The Pallas kernels have no VJP, and on the GPU they are the default: the first H200 training run after
    they became it died in jax.grad. The trainer's step traces its loss under dispatch.differentiable(), which
    swaps a kernel picked by default or by the environment for the op's jnp form. The kernels are forced here
    through the environment (their interpreted form has no VJP either)."""
    g, p = nnx.split(tiny_target())
    stream = np.random.default_rng(0).integers(2, 320, 400).astype(np.int32)
    batch = train.stream_batches(stream, 2, 24, 0)(0)
    loss_fn = train.target_loss(g)
    want_loss, want_grads = jax.value_and_grad(loss_fn)(p, (), batch)       # CPU defaults: jnp ops
    monkeypatch.setenv("JAXSPEC_TREE_ATTENTION", "pallas_interpret")
    monkeypatch.setenv("JAXSPEC_TREE_DELTA_RULE", "pallas_interpret")
    with pytest.raises(ValueError, match="does not support reverse-mode autodiff"):  # the premise: kernels have no VJP
        jax.value_and_grad(loss_fn)(p, (), batch)
    with train.dispatch.differentiable():
        loss, grads = jax.value_and_grad(loss_fn)(p, (), batch)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    for x, y in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    tr = train.Trainer(loss_fn, p, (), lambda step: batch, steps=3, opt=train.OptConfig(lr=1e-2, warmup=1),
                       name="lm", log_every=1000)
    losses = tr.run()
    assert len(losses) == 3 and np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_pair_files_add_package_files_to_the_target_and_the_drafters_prompts():
    """pair --package-text N: the target's training files and the drafter's prompt files each get their extra
    files; the evaluation's held-out files are the stdlib split's, with or without."""
    files = [Path(f"lib/f{i:03d}.py") for i in range(95)]
    t_pkgs, p_pkgs = [Path(f"site/t{i}.py") for i in range(5)], [Path(f"site/p{i}.py") for i in range(4)]
    tr0, held0, unseen0 = train.split_files(files, unseen=True)
    tr, held, prompts = train.pair_files(files, True, t_pkgs, p_pkgs)
    assert held == held0 and tr == tr0 + t_pkgs and prompts == unseen0 + p_pkgs
    assert not (set(tr) & set(prompts)) and not (set(held) & (set(tr) | set(prompts)))
    assert train.pair_files(files, True) == (tr0, held0, unseen0)            # no packages: split_files's sets
    tr, held, prompts = train.pair_files(files, False, t_pkgs)                # --drafter-prompts train
    assert held == held0 and prompts == [] and tr == train.split_files(files)[0] + t_pkgs


def test_split_files_sets_apart_unseen_prompt_files():
    """pair --drafter-prompts unseen: three disjoint sets covering every file: the target's training files, the
    evaluation's held-out files (unchanged from the two-way split) and the drafter's prompt files."""
    files = [f"f{i:03d}.py" for i in range(95)]
    train_2, held_2 = train.split_files(files)
    tr, held, unseen = train.split_files(files, unseen=True)
    assert held == held_2 == files[::20] and unseen == files[10::20]
    assert sorted(tr + held + unseen) == files and not (set(tr) & set(unseen)) and set(tr) < set(train_2)


def test_package_files_are_an_even_sample_of_the_installed_sources(tmp_path):
    """drafter --package-text N: N .py files of the packages' trees, only those of min..max bytes, evenly spaced
    over their sorted list (the same files on any machine with the same packages); too few is an error."""
    roots = [tmp_path / "site-packages", tmp_path / "dist-packages"]
    rng = np.random.default_rng(5)
    sizes = {}
    for i in range(40):
        f = roots[i % 2] / f"pkg{i % 3}" / f"m{i:02d}.py"
        f.parent.mkdir(parents=True, exist_ok=True)
        sizes[f] = int(rng.integers(10, 300))
        f.write_text("x" * sizes[f])
    (roots[0] / "notes.txt").write_text("y" * 100)                     # not a .py file
    fits = sorted(f for f, n in sizes.items() if 50 <= n <= 250)
    assert 10 < len(fits) < 40
    got = train.package_files(10, roots=roots, min_bytes=50, max_bytes=250)
    assert got == [fits[i * len(fits) // 10] for i in range(10)] and got == sorted(got) and len(set(got)) == 10
    assert train.package_files(10, roots=roots[::-1], min_bytes=50, max_bytes=250) == got
    assert train.package_files(len(fits), roots=roots, min_bytes=50, max_bytes=250) == fits
    with pytest.raises(ValueError, match=f"{len(fits)} .py files of 50..250 bytes"):
        train.package_files(len(fits) + 1, roots=roots, min_bytes=50, max_bytes=250)
    with pytest.raises(ValueError, match="n must be >= 1"):
        train.package_files(0, roots=roots)
    # part: two fixed halves, disjoint, together all the files; the same halves wherever the trees are
    import shutil

    def half(rts, part):          # the whole half: the largest n it serves
        for n in range(len(fits), 0, -1):
            try:
                return train.package_files(n, roots=rts, min_bytes=50, max_bytes=250, part=part)
            except ValueError as e:
                assert f"in the {part!r} half" in str(e)
        return []
    t, p = half(roots, "target"), half(roots, "prompts")
    assert t and p and not set(t) & set(p) and sorted(t + p) == fits
    moved = [tmp_path / "elsewhere" / r.name for r in roots]
    for r, m in zip(roots, moved):
        shutil.copytree(r, m)
    rel = lambda fs, rts: [str(f.relative_to(next(r for r in rts if f.is_relative_to(r)))) for f in fs]
    assert rel(half(moved, "target"), moved) == rel(t, roots) and rel(half(moved, "prompts"), moved) == rel(p, roots)
    with pytest.raises(ValueError, match="part must be one of"):
        train.package_files(1, roots=roots, part="eval")


def test_drafter_refuses_bad_package_text(tmp_path, capsys):
    """--package-text below 0, or more files than the installed packages hold: exit 2 naming the flag, before
    any model is read (the target here does not exist)."""
    base = ["drafter", "--target", str(tmp_path / "nope"), "--text", str(tmp_path), "--out", str(tmp_path / "o"),
            "--mask-token-id", "1"]
    assert train.main(base + ["--package-text", "-1"]) == 2
    assert "--package-text -1: must be >= 0" in capsys.readouterr().err
    assert train.main(base + ["--package-text", str(10 ** 9)]) == 2
    assert "--package-text 1000000000" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_seen_by_pair_names_the_stdlib_files_a_pair_trained_or_drafted_on(tmp_path):
    """eval --unseen-by: a file is seen when its path under the stdlib is in the pair's training or prompt split,
    wherever the stdlib lies; held-out files and files outside the stdlib are not."""
    root = tmp_path / "lib"
    files = [root / "a.py", root / "sub" / "b.py", root / "c.py", tmp_path / "other" / "a.py"]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("x = 1\n")
    res = {"corpus": {"stdlib_files": {"train": ["a.py"], "held_out": ["c.py"], "drafter_prompts": ["sub/b.py"]}}}
    assert train.seen_by_pair(files, res, stdlib_root=root) == files[:2]
    with pytest.raises(ValueError, match="no corpus.stdlib_files"):
        train.seen_by_pair(files, {"corpus": {}}, stdlib_root=root)
    # what eval measures recitation against: the training split's files this stdlib has, and how many were listed
    res["corpus"]["stdlib_files"]["train"] += ["gone.py", "a.py"]
    assert train.trained_on(res, stdlib_root=root) == ([root / "a.py"], 2)
    with pytest.raises(ValueError, match="no corpus.stdlib_files"):
        train.trained_on({"corpus": {}}, stdlib_root=root)


def test_eval_unseen_by_refuses_before_loading_models(tmp_path, capsys):
    """--unseen-by with results of no file names, or leaving no text: exit 2 naming the flag, before any model
    is read (the target here does not exist)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = [stdlib / "json" / "__init__.py", stdlib / "json" / "decoder.py"]
    base = ["eval", "--target", str(tmp_path / "nope"), "--draft", str(tmp_path / "nope"), "--out",
            str(tmp_path / "e.json"), "--text", *map(str, text), "--unseen-by"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"corpus": {"train_files": 3}}))
    assert train.main(base + [str(old)]) == 2
    assert f"--unseen-by {old}: it has no corpus.stdlib_files" in capsys.readouterr().err
    both = tmp_path / "both.json"
    both.write_text(json.dumps({"corpus": {"stdlib_files": {"train": ["json/__init__.py"], "held_out": [],
                                                            "drafter_prompts": ["json/decoder.py"]}}}))
    assert train.main(base + [str(both)]) == 2
    assert "every --text file was seen by that pair" in capsys.readouterr().err
    # not the shape `pair` writes: a line naming what is missing (a list: AttributeError; a part: a bare KeyError)
    for doc, why in (([], "it has no corpus.stdlib_files"),
                     ({"corpus": {"stdlib_files": {"train": []}}}, "its corpus.stdlib_files has no list 'drafter_prompts'"),
                     ({"corpus": {"stdlib_files": ["a.py"]}}, "its corpus.stdlib_files has no list 'train'")):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(doc))
        assert train.main(base + [str(bad)]) == 2
        err = capsys.readouterr().err
        assert f"error: --unseen-by {bad}: {why}" in err and "Traceback" not in err, err
    assert not (tmp_path / "e.json").exists()
    assert train.main(base[:-1] + ["--temperature", "0.7", "--top-p", "1.5"]) == 2      # also before any model
    assert "--top-p must be in (0, 1], got 1.5" in capsys.readouterr().err


def test_evaluate_counts_characters_per_round(monkeypatch):
    """`evaluate(..., detokenize=...)`: the characters of each method's continuations and per verify round, so
    that pairs with different tokenizers compare. One character a token here, so characters a round are tau.
    With `corpus=`: AR's continuations go to `recitation` (tested above; here it says prompt 0 recites all and
    prompt 1 nothing), and the speculative methods get tau over the prompts that do not recite."""
    prompts = np.random.default_rng(3).integers(2, 300, (2, 8)).astype(np.int32)
    one_char = lambda ids: "".join("x" for _ in ids)
    corpus, seen = [np.arange(5, 40)], []
    def recitation(p, conts, c):
        seen.append((p, [list(map(int, t)) for t in conts], c))
        return {"n": 16, "mean": 0.5, "share_of_prompts_above_half": 0.5, "per_prompt": [1.0, 0.0]}
    monkeypatch.setattr(train, "recitation", recitation)
    m = train.evaluate(tiny_target(), tiny_drafter(block=4), prompts, 6, 4, (), detokenize=one_char, corpus=corpus)
    (p, conts, c), = seen
    assert p is prompts and c is corpus and [len(t) for t in conts] == [6, 6]
    assert m["ar"]["recitation"]["per_prompt"] == [1.0, 0.0] and "not_reciting" not in m["ar"]
    fresh = m["dflash"]["not_reciting"]
    assert fresh["max_share"] == train.FRESH and fresh["prompts"] == 1
    assert np.isclose(fresh["tau"], m["dflash"]["tau_per_prompt"][1])
    assert set(m) == {"ar", "dflash"}
    assert m["ar"]["repetition"]["n"] == 8 and 0.0 <= m["ar"]["repetition"]["mean"] <= 1.0
    assert m["ar"]["texts"] == ["x" * 6, "x" * 6] and "texts" not in m["dflash"]      # AR's continuations, as text
    for k, e in m.items():
        assert e["chars"] == e["tokens"] == 12 and np.isclose(e["chars_per_round"], e["tau"]), k
        # per prompt: the rounds add up and, weighted by them, the prompts' tau give the whole tau
        assert len(e["tau_per_prompt"]) == 2 and sum(e["rounds_per_prompt"]) == e["rounds"], k
        assert np.isclose(train.tau_where(e["tau_per_prompt"], e["rounds_per_prompt"], [True, True]), e["tau"]), k
    quiet = sum(x is not None and x <= train.QUIET for x in m["ar"]["repetition"]["per_prompt"])
    assert m["dflash"]["not_looping"]["prompts"] == quiet and "not_looping" not in m["ar"]


def test_evaluate_past_its_deadline_still_compares_each_method():
    """A deadline already past (a slow machine) skips only the further DDTree budgets: AR, DFlash and the first
    budget still run, so the results always compare every method."""
    prompts = np.random.default_rng(4).integers(2, 300, (1, 8)).astype(np.int32)
    m = train.evaluate(tiny_target(), tiny_drafter(block=4), prompts, 4, 4, (3, 5), deadline=0.0)
    assert set(m) == {"ar", "dflash", "ddtree_b3"}
    assert m["dflash"]["identical_to_ar"] and m["ddtree_b3"]["identical_to_ar"]
    assert m["dflash"]["first_difference_per_prompt"] == [None] and m["dflash"]["identical_prompts"] == 1


def test_evaluate_samples_when_asked():
    """`evaluate(..., sampling=...)` (eval --temperature/--top-k/--top-p): every method samples, prompt i with seed
    i; tau and speed as greedy, no identity to AR (other draws from the same distribution) and no greedy
    diagnostics. AR's continuations are the sampled ones (seed i), not greedy AR's."""
    from jaxspec.engine import Engine
    from jaxspec.sampling import Sampling
    prompts = np.random.default_rng(7).integers(2, 300, (2, 8)).astype(np.int32)
    target, drafter, s = tiny_target(), tiny_drafter(block=4), Sampling(1.5, 50, 0.95)
    m = train.evaluate(target, drafter, prompts, 6, 4, (3,), detokenize=lambda ids: list(ids), sampling=s)
    assert set(m) == {"ar", "dflash", "ddtree_b3"}
    for k in ("dflash", "ddtree_b3"):
        assert m[k]["identical_to_ar"] is None and m[k]["identical_prompts"] is None, k
        assert "first_difference_per_prompt" not in m[k] and m[k]["tau"] >= 1.0 and m[k]["tokens"] == 12, k
    assert "depth1_agreement" not in m["ar"] and "target_confidence" not in m["ar"]
    sampled, greedy = Engine(target, sampling=s, stop_tokens=()), Engine(target, stop_tokens=())
    for i, p in enumerate(prompts):
        assert m["ar"]["texts"][i] == sampled.generate([list(map(int, p))], 6, seed=i).tokens[0]
    assert m["ar"]["texts"] != [greedy.generate([list(map(int, p))], 6).tokens[0] for p in prompts]


def test_first_difference_says_where_two_continuations_part():
    """The eval's per-prompt record of where a method's tokens part from AR's (bf16 runs part at near-ties)."""
    assert train.first_difference([5, 6, 7], np.array([5, 6, 7])) is None
    assert train.first_difference([5, 6, 7], [5, 9, 7]) == 1
    assert train.first_difference([5, 6, 7], [4, 6, 7]) == 0
    assert train.first_difference([5, 6], [5, 6, 7]) == 2          # one a prefix of the other: where it stops


def test_evaluate_times_the_methods_in_turn_on_each_prompt(monkeypatch):
    """Every method compiles first; then each prompt runs under every method before the next prompt starts (in a
    rotating order), so a machine whose speed drifts over minutes shifts every method's decode time alike."""
    from jaxspec import engine as E
    calls = []
    generate = E.Engine.generate
    def recording(self, prompts, *a, **kw):
        calls.append((self.spec.name + str(getattr(self.spec, "budget", "") or ""), prompts[0][0]))
        return generate(self, prompts, *a, **kw)
    monkeypatch.setattr(E.Engine, "generate", recording)
    prompts = np.random.default_rng(5).integers(2, 300, (3, 8)).astype(np.int32)
    prompts[:, 0] = [11, 12, 13]
    m = train.evaluate(tiny_target(), tiny_drafter(block=4), prompts, 4, 4, (3,))
    names = ["ar", "dflash", "ddtree3"]
    assert calls[:3] == [(n, 11) for n in names]                      # the compiles, on the first prompt
    timed = calls[3:]
    assert [p for _, p in timed] == [11] * 3 + [12] * 3 + [13] * 3
    assert [n for n, _ in timed] == names + names[1:] + names[:1] + names[2:] + names[:2]
    assert set(m) == {"ar", "dflash", "ddtree_b3"} and all(len(e["tau_per_prompt"]) == 3 for e in m.values())
    assert m["dflash"]["identical_to_ar"] and m["ddtree_b3"]["identical_to_ar"]


def test_evaluate_keeps_the_text_where_a_method_parts_from_ar(monkeypatch):
    """Where a method's tokens part from AR's (as bf16 or other product precisions can), the eval says where and
    keeps what the method wrote, by prompt; prompts identical to AR's keep nothing beyond AR's own texts."""
    from jaxspec import engine as E
    generate = E.Engine.generate
    def parting(self, prompts, *a, **kw):
        r = generate(self, prompts, *a, **kw)
        if self.spec.name == "dflash" and prompts[0][0] == 12:       # the second prompt's last token, changed
            r.tokens[0][-1] = r.tokens[0][-1] + 1
        return r
    monkeypatch.setattr(E.Engine, "generate", parting)
    prompts = np.random.default_rng(5).integers(2, 300, (2, 8)).astype(np.int32)
    prompts[:, 0] = [11, 12]
    text = lambda ids: " ".join(map(str, ids))
    m = train.evaluate(tiny_target(), tiny_drafter(block=4), prompts, 5, 4, (), detokenize=text)
    assert m["dflash"]["first_difference_per_prompt"] == [None, 4] and m["dflash"]["identical_prompts"] == 1
    ar1 = [int(x) for x in m["ar"]["texts"][1].split()]
    assert m["dflash"]["texts_where_different"] == {"1": text(ar1[:4] + [ar1[4] + 1])}


def test_evaluate_runs_ar_as_a_tile_of_rows_and_compares_with_it(monkeypatch):
    """`evaluate(..., ar_rows=R)` (eval --ar-rows): AR's step also runs as a tile of R rows (`ar_rows<R>`, one token a
    round, AR's tokens here in fp32; kept past the deadline) and each speculative method counts the prompts on
    which it gives that AR's tokens, which differ from plain AR's where that AR's tokens differ."""
    from jaxspec import engine as E
    prompts = np.random.default_rng(6).integers(2, 300, (2, 8)).astype(np.int32)
    prompts[:, 0] = [11, 12]
    m = train.evaluate(tiny_target(), tiny_drafter(block=4), prompts, 5, 4, (3,), deadline=0.0, ar_rows=5)
    assert set(m) == {"ar", "ar_rows5", "dflash", "ddtree_b3"}
    assert m["ar_rows5"]["tau"] == 1.0 and m["ar_rows5"]["identical_prompts"] == 2
    assert "identical_prompts_to_ar_rows" not in m["ar_rows5"] and "identical_prompts_to_ar_rows" not in m["ar"]
    assert m["dflash"]["identical_prompts_to_ar_rows"] == m["ddtree_b3"]["identical_prompts_to_ar_rows"] == 2
    generate = E.Engine.generate
    def parting(self, prompts, *a, **kw):
        r = generate(self, prompts, *a, **kw)
        if getattr(self.spec, "rows", 1) > 1 and prompts[0][0] == 12:     # the tile's second prompt, changed
            r.tokens[0][-1] = r.tokens[0][-1] + 1
        return r
    monkeypatch.setattr(E.Engine, "generate", parting)
    m = train.evaluate(tiny_target(), tiny_drafter(block=4), prompts, 5, 4, (), ar_rows=5)
    assert m["ar_rows5"]["identical_prompts"] == 1 and m["ar_rows5"]["first_difference_per_prompt"] == [None, 4]
    assert m["dflash"]["identical_prompts"] == 2 and m["dflash"]["identical_prompts_to_ar_rows"] == 1


def test_git_info_prefers_the_commit_it_is_told(monkeypatch):
    """JAXSPEC_COMMIT / JAXSPEC_DIRTY (a run from an exported snapshot) win over the checkout's own git; without
    them, the checkout's HEAD and whether tracked files differ from it."""
    from jaxspec.provenance import git_info
    monkeypatch.setenv("JAXSPEC_COMMIT", "f" * 40)
    monkeypatch.setenv("JAXSPEC_DIRTY", "0")
    assert git_info() == {"commit": "f" * 40, "dirty": False, "source": "env"}
    monkeypatch.delenv("JAXSPEC_DIRTY")
    assert git_info()["dirty"] is True          # not said: not known to be clean
    monkeypatch.delenv("JAXSPEC_COMMIT")
    g = git_info()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True)
    assert g["source"] == ("git" if head.returncode == 0 else "none")
    assert g["commit"] == (head.stdout.strip() if head.returncode == 0 else "unknown")


# ------------------------------------------------------------------------------------------------
# The commands' flags, resume, Ctrl-C and whole writes


@pytest.fixture(scope="module")
def cli_target(tmp_path_factory):
    """A tiny exported target with its tokenizer (tgt/) and a text dir (text/): `drafter_args` trains on it in a few
    seconds."""
    from jaxspec.export import export_target
    root = tmp_path_factory.mktemp("cli")
    texts = [f"def k{i}(v):\n    return v + {i}\n\n" * 10 for i in range(16)]
    export_target(tiny_target(), root / "tgt")
    train.save_tokenizer(train.train_tokenizer(texts, 320), root / "tgt")
    (root / "text").mkdir()
    (root / "text" / "a.py").write_text("".join(texts))
    return root


def drafter_args(root, out, *extra):
    return ["drafter", "--target", str(root / "tgt"), "--text", str(root / "text"), "--out", str(out),
            "--mask-token-id", "1", "--block", "4", "--layers", "1", "--heads", "1", "--kv-heads", "1", "--head-dim",
            "8", "--window", "32", "--windows", "8", "--batch", "2", "--anchors", "1", "--prompt-len", "4",
            "--gen-batch", "4", "--dtype", "float32", *extra]


@pytest.mark.parametrize("flags,message", [
    (["--steps", "0"], "--steps 0: must be >= 1"), (["--block", "1"], "--block 1: must be >= 2"),
    (["--lr", "0"], "--lr 0: must be > 0"), (["--gamma", "0"], "--gamma 0: must be > 0"),
    (["--windows", "-1"], "--windows -1: must be >= 0"), (["--time-budget-s", "-5"], "--time-budget-s -5: must be"),
    (["--ckpt-every", "-1"], "--ckpt-every -1: must be >= 0 (0: a checkpoint only at the end)"),
    (["--batch", "0"], "--batch 0: must be >= 1"), (["--gen-batch", "0"], "--gen-batch 0: must be >= 1"),
    (["--anchors", "0"], "--anchors 0: must be >= 1"), (["--window", "0"], "--window 0: must be >= 1"),
    (["--seed", "-1"], "--seed -1: must be >= 0"), (["--window", "6"], "--window 6: too short for --anchors 1 "
                                                                        "blocks of 4 tokens"),
    (["--window", "6"], "the least is 7"), (["--data", "greedy", "--sequences", "0"], "--sequences 0: must be >= 1"),
    # these need the target or the text
    (["--taps", "0", "99"], "--taps 0 99: 99 is not a layer of the target (layers 0..3)"),
    (["--taps", "1", "1"], "--taps 1 1: layer 1 is listed twice"),
    (["--n-taps", "10"], "--n-taps 10: the target's 4 layers give at most 2 distinct taps"),
    (["--mask-token-id", "320"], "--mask-token-id 320: outside the target's vocabulary (0..319)"),
    (["--data", "greedy", "--prompt-len", "100000"], "--text: no document longer than 100001 tokens (--prompt-len "
                                                     "100000)"),
    (["--window", "100000"], "shorter than one window (--window 100000)")])
def test_drafter_refuses_bad_numbers_up_front(cli_target, tmp_path, capsys, flags, message):
    """`drafter`'s numbers are checked before anything is made: exit 2 with one line naming the flag and the value
    (they were a nan loss, an untrained export, ZeroDivisionError, a KeyError or a range() error)."""
    assert train.main(drafter_args(cli_target, tmp_path / "o", *flags)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_drafter_whose_data_took_the_whole_time_budget(cli_target, tmp_path, capsys):
    """A --time-budget-s that making the data used up: exit 2 naming the flag (it trained 1 step, exited 0, and a
    rerun resumed that finished 1-step run); the data is kept, and a rerun without the budget trains on it."""
    out = tmp_path / "o"
    assert train.main(drafter_args(cli_target, out, "--steps", "2", "--time-budget-s", "0.001")) == 2
    err = capsys.readouterr().err
    assert "error: --time-budget-s 0.001: making the data took all of it" in err, err
    assert f"the data is kept in {out}: rerun with a larger --time-budget-s, or none" in err
    assert not (out / "drafter").exists() and train.newest_meta(out / "ckpt") is None     # no step saved
    assert train.main(drafter_args(cli_target, out, "--steps", "2")) == 0
    assert (out / "drafter" / "config.json").is_file()


def test_drafter_hands_its_trainer_the_recipes_schedule_labels_anchors_and_held_out_rows(cli_target, tmp_path,
                                                                                         monkeypatch):
    """What `drafter` hands its Trainer, caught there (nothing trains): a warm-up of 4% of --steps (--help: "linear
    warm-up over the first 4%"), labels masked off the greedy path unless --stream-labels, anchors after the first
    --prompt-len - 1 tokens (--help), and with --val-sequences N the last N windows held out, the training batches
    drawn from the others (the windows: the first --windows of `corpus_windows` over the text's token stream)."""
    class Caught(Exception):
        pass
    seen, real_windows = {}, train.corpus_windows

    def catch(name):
        real = getattr(train, name)

        def f(*a, **kw):
            seen.setdefault(name, []).append((a, kw))
            return real(*a, **kw)
        monkeypatch.setattr(train, name, f)
    for name in ("drafter_loss_cached", "cached_batches", "drafter_batches", "held_out_batches", "corpus_windows"):
        catch(name)

    def trainer(loss_fn, params, frozen, batch_at, **kw):
        seen["trainer"] = kw
        raise Caught
    monkeypatch.setattr(train, "Trainer", trainer)

    def run(out, *flags):
        seen.clear()
        with pytest.raises(Caught):
            train.main(drafter_args(cli_target, tmp_path / out, "--steps", "100", *flags))     # --prompt-len 4
        return seen
    got = run("c")                                                                            # --features cache
    assert got["trainer"]["opt"].warmup == 4 and got["trainer"]["opt"].lr == pytest.approx(6e-4)
    assert [kw.get("exact", True) for _, kw in got["drafter_loss_cached"]] == [True]
    assert got["cached_batches"][0][0][5] == 3
    got = run("c", "--stream-labels")
    assert [kw.get("exact", True) for _, kw in got["drafter_loss_cached"]] == [False]
    got = run("l", "--features", "live", "--val-sequences", "2")                              # --windows 8
    (stream, window, seed), _ = got["corpus_windows"][0]
    windows = np.stack([stream[s:s + window] for s in real_windows(stream, window, seed)[:8]])
    (train_seqs, train_lo, *_), _ = got["drafter_batches"][0]
    (rows, n_val, *_, held_lo, _), _ = got["held_out_batches"][0]
    held = rows(np.arange(n_val))["tokens"]
    assert n_val == 2 and train_lo == held_lo == 3
    np.testing.assert_array_equal(train_seqs, windows[:6])
    np.testing.assert_array_equal(held, windows[6:])
    assert not any(np.array_equal(h, x) for h in held for x in train_seqs)


def test_drafter_refuses_token_ids_outside_the_targets_vocabulary(cli_target, tmp_path, capsys):
    """A --target dir whose tokenizer has more tokens (400) than the model's vocabulary (320): exit 2 naming the
    dir and both sizes (the target clamped the ids, the drafter's embedding lookup gave NaN)."""
    import shutil
    tgt = tmp_path / "tgt"
    shutil.copytree(cli_target / "tgt", tgt)
    texts = [f"import os\nclass C{i}:\n    def m(self, x):\n        return x * {i} + os.sep\n\n" * 10
             for i in range(40)]
    train.save_tokenizer(train.train_tokenizer(texts, 400), tgt)
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.py").write_text("".join(texts))
    args = drafter_args(cli_target, tmp_path / "o", "--steps", "2")
    args[args.index("--target") + 1], args[args.index("--text") + 1] = str(tgt), str(tmp_path / "text")
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert f"--target {tgt}: its tokenizer gives token id 3" in err and "(a vocabulary of at least " in err, err
    assert "but the model's vocabulary has 320 tokens (ids 0..319)" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
    # eval reads the same tokenizer: refused the same way, before any method runs
    from jaxspec.export import export_drafter
    drf = tmp_path / "drf"
    export_drafter(tiny_drafter((FULL,), block=4), drf, num_target_layers=tiny_target().cfg.num_layers)
    assert train.main(["eval", "--target", str(tgt), "--draft", str(drf), "--text", str(tmp_path / "text"), "--out",
                       str(tmp_path / "r.json"), "--prompts", "1", "--prompt-len", "8", "--max-new", "2",
                       "--budgets", "2"]) == 2
    err = capsys.readouterr().err
    assert f"--target {tgt}: its tokenizer gives token id 3" in err and "Traceback" not in err, err
    assert not (tmp_path / "r.json").exists()


def test_drafter_and_eval_name_a_missing_init_or_draft(cli_target, tmp_path, capsys):
    """--init or --draft at a path that does not exist, or at a file: exit 2 naming the flag and which (it was
    "<path>: not a directory" either way)."""
    (tmp_path / "f").write_text("x")
    for path, why in ((tmp_path / "nowhere", "does not exist"), (tmp_path / "f", "is not a directory")):
        assert train.main(drafter_args(cli_target, tmp_path / "o", "--init", str(path))) == 2
        assert f"error: --init {path}: {why}" in capsys.readouterr().err
        assert train.main(["eval", "--target", str(cli_target / "tgt"), "--draft", str(path), "--text",
                           str(cli_target / "text"), "--out", str(tmp_path / "r.json")]) == 2
        assert f"error: --draft {path}: {why}" in capsys.readouterr().err


def test_drafter_that_diverges_exits_2_keeping_its_finite_checkpoints(cli_target, tmp_path, capsys):
    """A NaN loss (--lr 1e30): exit 2 with one line naming the step and --lr (it was a traceback, rc 1), and no
    checkpoint holds a non-finite loss (the NaN state was saved as the newest, and resumed by a rerun)."""
    out = tmp_path / "o"
    assert train.main(drafter_args(cli_target, out, "--lr", "1e30", "--ckpt-every", "10", "--steps", "30")) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("error:"))
    assert "Traceback" not in err and "training diverged; the checkpoints before it are kept" in line, err
    assert "rerun with a lower --lr and a new --out" in line
    step = int(line.split(" at step ")[1].split(":")[0])
    for meta in (out / "ckpt" / "meta").glob("*.json"):
        m = json.loads(meta.read_text())
        assert m["step"] < step and all(np.isfinite(m["losses"])), (meta, m["losses"])
    assert not (out / "drafter").exists()


def test_drafter_refuses_a_text_dir_without_text_files(cli_target, tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.json").write_text("{}")
    args = drafter_args(cli_target, tmp_path / "o")
    args[args.index("--text") + 1] = str(tmp_path / "notes")
    assert train.main(args) == 2
    assert f"--text {tmp_path / 'notes'}: the directory holds no .py, .txt, .md files" in capsys.readouterr().err


def test_drafter_rerun_with_other_flags_is_refused_and_more_steps_train_on(cli_target, tmp_path, capsys):
    """A rerun into the same --out resumes only the same run: other shaping flags, or another target of the same
    shapes, are refused naming each (old -> new); a larger --steps trains the finished run on to the new total, a
    --steps below the step reached is refused."""
    import shutil
    from jaxspec.export import export_target
    out = tmp_path / "o"
    assert train.main(drafter_args(cli_target, out, "--steps", "2")) == 0
    capsys.readouterr()
    assert train.main(drafter_args(cli_target, out, "--steps", "2", "--block", "3", "--lr", "1e-3", "--seed", "1")) == 2
    err = capsys.readouterr().err
    assert "--block: 4 -> 3" in err and "--lr: 0.0006 -> 0.001" in err and "--seed: 0 -> 1" in err, err
    assert "--anchors" not in err and "Pass a new --out to start another run, or the old flags" in err
    other = tmp_path / "tgt2"
    shutil.copytree(cli_target / "tgt", other)
    export_target(tiny_target(seed=1), other)                # other weights; the tokenizer files stay
    args = drafter_args(cli_target, out, "--steps", "2")
    args[args.index("--target") + 1] = str(other)
    assert train.main(args) == 2
    assert "--target (its weights): " in capsys.readouterr().err
    assert train.main(drafter_args(cli_target, out, "--steps", "4")) == 0
    assert "--steps 2 -> 4: training on from step 2 to 4" in capsys.readouterr().err
    meta = json.loads((out / "ckpt" / "meta" / "4.json").read_text())
    assert meta["step"] == meta["steps"] == meta["steps_asked"] == 4 and len(meta["losses"]) == 4
    assert train.main(drafter_args(cli_target, out, "--steps", "3")) == 2
    assert "--steps 3: the run in" in capsys.readouterr().err


@pytest.mark.parametrize("signame,status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_inside_a_step_saves_and_exits(cli_target, tmp_path, capsys, monkeypatch, signame, status):
    """A SIGINT (Ctrl-C) or SIGTERM (`timeout`, a preemption) arriving while a jitted step owns the donated params and
    optimizer state stops training after that step, saves it and exits 128 + the signal with one line (SIGINT was
    "Array has been deleted" and the steps lost; SIGTERM ended the run without a checkpoint); the same command then
    resumes there."""
    import signal
    sig = getattr(signal, signame)
    init = train.Trainer.__init__

    def interrupted_at_step_3(self, *a, **kw):
        init(self, *a, **kw)
        step_fn = self._step_fn

        def step(*args):
            out = step_fn(*args)                      # args 0 and 1 are donated to this call
            if int(args[4]) == 2:
                signal.raise_signal(sig)
            return out
        self._step_fn = step
    monkeypatch.setattr(train.Trainer, "__init__", interrupted_at_step_3)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out = tmp_path / "o"
    try:
        rc = train.main(drafter_args(cli_target, out, "--steps", "5"))
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped main()")
    err = capsys.readouterr().err
    assert rc == status and "Traceback" not in err and f"drafter: {signame}; stopping once" in err, err
    assert f"interrupted at step 3; checkpoint saved in {out / 'ckpt'}; rerun the same command to resume" in err
    assert all(signal.getsignal(s) is h for s, h in before.items()) and not (out / "drafter").exists()
    monkeypatch.undo()
    assert train.main(drafter_args(cli_target, out, "--steps", "5")) == 0
    assert "resumed from" in capsys.readouterr().err and (out / "drafter" / "config.json").is_file()
    assert len(json.loads((out / "ckpt" / "meta" / "5.json").read_text())["losses"]) == 5


def test_an_unreadable_target_tokenizer_and_evals_own_refusals(cli_target, tmp_path, capsys, monkeypatch):
    """A --target whose tokenizer.json is damaged: `drafter` and `eval` end in one line naming the flag (it was a
    ValueError traceback). `eval --seed -1` names --seed (it blamed --text), and Ctrl-C in `eval`, which keeps no
    checkpoints, does not advise resuming."""
    import shutil
    from jaxspec.export import export_drafter
    tgt = tmp_path / "tgt"
    shutil.copytree(cli_target / "tgt", tgt)
    (tgt / "tokenizer.json").write_text('{"truncated": ')
    args = drafter_args(cli_target, tmp_path / "o", "--steps", "2")
    args[args.index("--target") + 1] = str(tgt)
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith(f"error: --target {tgt}: ") and "Traceback" not in err, err
    assert "tokenizer" in err and not (tmp_path / "o" / "drafter").exists()
    drf = tmp_path / "drf"
    export_drafter(tiny_drafter((FULL,), block=4), drf, num_target_layers=tiny_target().cfg.num_layers)
    run = ["eval", "--draft", str(drf), "--text", str(cli_target / "text"), "--out", str(tmp_path / "r.json"),
           "--prompts", "1", "--prompt-len", "8", "--max-new", "2", "--budgets", "2"]
    assert train.main(run + ["--target", str(tgt)]) == 2
    err = capsys.readouterr().err
    assert f"error: --target {tgt}: " in err and "Traceback" not in err, err
    assert train.main(run + ["--target", str(cli_target / "tgt"), "--seed", "-1"]) == 2
    assert "--seed -1: must be >= 0" in capsys.readouterr().err
    monkeypatch.setattr(train, "run_eval", lambda args: (_ for _ in ()).throw(KeyboardInterrupt))
    assert train.main(run + ["--target", str(cli_target / "tgt")]) == 130
    err = capsys.readouterr().err
    assert "eval keeps no checkpoints: rerun it to start over" in err and "resume" not in err, err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")    # Orbax's failed restore, at exit
def test_checkpoints_carry_their_metadata_and_a_damaged_step_is_skipped(tmp_path, capsys):
    """Each step's metadata is its own file, written before the step's arrays: metadata for a step whose arrays never
    came is not read. A step whose arrays do not restore is skipped (and said) for the one before, and set aside so
    that it can be saved again; unreadable metadata and steps none of which restores are one-line ConfigErrors;
    the single meta.json of older checkpoints is still read for its step."""
    import shutil
    ck = tmp_path / "ck"
    tr = _drafter_trainer(ck, steps=6)
    tr.ckpt_every, tr.config = 2, {"--lr": 0.01, "--seed": 0}
    tr.run(max_steps=4)                                          # checkpoints at steps 2 and 4
    assert sorted(p.name for p in (ck / "meta").iterdir()) == ["2.json", "4.json"]
    other = _drafter_trainer(ck, steps=6)
    other.config = {"--lr": 0.02, "--seed": 0}
    with pytest.raises(train.ConfigError, match="other settings: --lr: 0.01 -> 0.02. Pass a new --out"):
        other.restore()
    meta4 = json.loads((ck / "meta" / "4.json").read_text())
    (ck / "meta" / "6.json").write_text(json.dumps({**meta4, "step": 6}))     # an interrupted save of step 6
    for f in (ck / "4").rglob("manifest.ocdbt"):
        f.write_bytes(b"damaged")
    capsys.readouterr()
    again = _drafter_trainer(ck, steps=6)
    again.config = tr.config
    assert again.restore() and again.step == 2 and again.losses == tr.losses[:2]
    err = capsys.readouterr().err
    assert "skipping the checkpoint of step 4" in err and "its arrays do not restore" in err
    assert (ck / "unrestorable" / "4").is_dir()
    again.ckpt_every = 2
    again.run()                                                  # steps 4 and 6 saved again
    assert sorted(p.name for p in (ck / "meta").iterdir()) == ["4.json", "6.json"]
    (ck / "meta" / "6.json").write_text('{"step": 6, "ste')      # truncated
    with pytest.raises(train.ConfigError, match=r"meta/6\.json: unreadable checkpoint metadata"):
        _drafter_trainer(ck, steps=6).restore()
    shutil.rmtree(ck / "meta")
    with pytest.raises(train.ConfigError, match="no checkpoint restores .step 6: it has no metadata"):
        _drafter_trainer(ck, steps=6).restore()
    (ck / "meta.json").write_text(json.dumps({k: v for k, v in meta4.items() if k in ("step", "steps", "warmup",
                                                                                        "losses")}))
    legacy = _drafter_trainer(ck, steps=6)
    assert legacy.restore() and legacy.step == 4 and not (ck / "6").exists()    # 6: no metadata, set aside
    (ck / "meta.json").write_text('{"step": 4')
    with pytest.raises(train.ConfigError, match=r"meta\.json: unreadable checkpoint metadata"):
        _drafter_trainer(ck, steps=6).restore()


@pytest.mark.parametrize("name", ["a[1]", "back\\slash"])
def test_a_checkpoint_dir_that_orbax_globs_is_refused(cli_target, tmp_path, capsys, name):
    """Orbax's writer globs its paths: checkpoints under `a[1]` or a backslash would be saved "successfully" and
    never restore (a resumed run would start over). drafter's --out, pair's --out / --work, and the Trainer itself
    refuse such a dir before any work; a pair's --out is fine when --work holds the checkpoints."""
    bad = tmp_path / name / "run"
    assert train.main(drafter_args(cli_target, bad)) == 2
    err = capsys.readouterr().err
    assert f"--out {bad}: has " in err and "which Orbax's writer takes as a glob pattern" in err, err
    assert train.main(["pair", "--tiny", "--out", str(bad)]) == 2
    assert f"--out {bad}: has " in capsys.readouterr().err
    assert train.main(["pair", "--tiny", "--out", str(tmp_path / "p"), "--work", str(bad)]) == 2
    assert f"--work {bad}: has " in capsys.readouterr().err
    assert not (tmp_path / name).exists() and not (tmp_path / "p").exists()
    with pytest.raises(ValueError, match=re.escape(f"t: checkpoint dir {bad / 'ck'}: has ")):
        _drafter_trainer(bad / "ck", steps=6)


def test_out_that_is_a_file_is_refused(cli_target, tmp_path, capsys):
    """--out (or pair's --work) at a regular file, or under one: exit 2 with one line (was FileExistsError)."""
    f = tmp_path / "file"
    f.write_text("x")
    assert train.main(drafter_args(cli_target, f)) == 2
    assert f"--out {f}: it is a file, not a directory" in capsys.readouterr().err
    assert train.main(drafter_args(cli_target, f / "sub")) == 2
    assert f"--out {f / 'sub'}: {f} is a file, not a directory" in capsys.readouterr().err
    assert train.main(["pair", "--tiny", "--out", str(f)]) == 2
    assert train.main(["pair", "--tiny", "--out", str(tmp_path / "p"), "--work", str(f)]) == 2
    assert f"--work {f}: it is a file" in capsys.readouterr().err and not (tmp_path / "p").exists()
    assert train.main(["eval", "--target", "t", "--draft", "d", "--text", "x", "--out", str(tmp_path)]) == 2
    assert "is a directory; eval writes a JSON file" in capsys.readouterr().err


def test_a_failed_export_or_pack_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    """A full disk in the middle of an export (or of packing the pair's parts) leaves the previous export (parts)
    as it was, and no temporary files; a good export replaces the weights and keeps the dir's other files."""
    from convert.drafter import load_drafter
    from convert.hf import load_target
    from jaxspec import export
    old, new = tiny_drafter((FULL,), block=4, scale=True), tiny_drafter((FULL,), block=4, seed=2, scale=True)
    export.export_drafter(old, tmp_path / "d", num_target_layers=4)
    (tmp_path / "d" / "README.md").write_text("notes")
    target = tiny_target()
    export.export_target(target, tmp_path / "t")

    def full_disk(tensors, path, metadata=None):
        Path(path).write_bytes(b"partial")
        raise OSError(28, "No space left on device")
    with monkeypatch.context() as m:
        m.setattr(export, "save_file", full_disk)
        with pytest.raises(OSError, match="No space"):
            export.export_drafter(new, tmp_path / "d", num_target_layers=4)
        with pytest.raises(OSError, match="No space"):
            export.export_target(tiny_target(seed=1), tmp_path / "t")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "t"]
    for model, back in ((old, load_drafter(tmp_path / "d")), (target, load_target(tmp_path / "t"))):
        assert_same_bits(model, back)
    export.export_drafter(new, tmp_path / "d", num_target_layers=4)
    assert_same_bits(new, load_drafter(tmp_path / "d"))
    assert (tmp_path / "d" / "README.md").read_text() == "notes"
    # pack: the previous parts stay until all the new ones are written
    pair, out = tmp_path / "pair", tmp_path / "out"
    pair.mkdir()
    out.mkdir()
    (pair / "a.bin").write_bytes(bytes(range(256)) * 40)
    parts = train.pack(pair, out, 4096)
    was = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(was) == sorted([p.name for p in parts] + [train.PACK_SUMS])
    (pair / "a.bin").write_bytes(bytes(range(256)) * 80)
    write_bytes = Path.write_bytes

    def fails_at_part_1(self, data):
        if self.name == "pair.tar.01":
            raise OSError(28, "No space left on device")
        return write_bytes(self, data)
    with monkeypatch.context() as m:
        m.setattr(Path, "write_bytes", fails_at_part_1)
        with pytest.raises(OSError, match="No space"):
            train.pack(pair, out, 4096)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == was
    replace = os.replace

    def dies_at_part_1(src, dst):                                # a crash between two renames: a mixed set ...
        if Path(dst).name == "pair.tar.01":
            raise KeyboardInterrupt
        return replace(src, dst)
    with monkeypatch.context() as m:
        m.setattr(train.os, "replace", dies_at_part_1)
        with pytest.raises(KeyboardInterrupt):
            train.pack(pair, out, 4096)
    assert not (out / train.PACK_SUMS).exists()                  # ... has no list of digests
    for left in (".drafter.tmp-99-0123456789ab", ".target.old-99-0123456789ab"):   # what a killed export leaves
        (pair / left).mkdir()                                                       # is not packed
        (pair / left / "config.json").write_text("{}")
    parts = train.pack(pair, out, 4096)
    assert len(parts) > len(was) and sorted(out.iterdir()) == sorted(parts + [out / train.PACK_SUMS])
    sums = subprocess.run(["sha256sum", "-c", train.PACK_SUMS], cwd=out, capture_output=True, text=True)
    assert sums.returncode == 0 and sums.stdout.count(": OK") == len(parts), sums.stdout + sums.stderr
    import io
    import tarfile
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as tf:
        assert tf.getnames() == ["demo", "demo/a.bin"]


def test_help_states_the_tiny_sizes_and_the_drafters_optimizer():
    """pair --target-width / --target-layers say what --tiny gives, and drafter --lr the schedule and AdamW's
    settings, as the code has them."""
    import argparse
    sub = next(a for a in train.parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {(name, a.option_strings[0]): a.help for name, p in sub.choices.items() for a in p._actions
             if a.option_strings}
    tiny, full = train.tiny_sizes().target, train.full_sizes().target
    assert f"default: {full.hidden_size}, --tiny {tiny.hidden_size}" in helps["pair", "--target-width"]
    assert f"default: {full.num_layers}, --tiny {tiny.num_layers}" in helps["pair", "--target-layers"]
    o, lr = train.OptConfig(), helps["drafter", "--lr"] % {"default": 6e-4}
    for said in ("warm-up over the first 4% of --steps", f"cosine decay to {o.min_lr_frac:.0%} of the peak",
                 f"beta2 {o.b2}", f"weight decay {o.weight_decay}", f"global norm {o.clip}"):
        assert said in lr, (said, lr)


def test_every_flag_has_help_and_says_its_default():
    """--help of each command: every flag has a line, and those with a default say it."""
    import argparse
    sub = next(a for a in train.parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {a.option_strings[0]}" for name, p in sub.choices.items() for a in p._actions
               if not isinstance(a, argparse._HelpAction)
               and (not a.help or (a.default not in (None, False) and "default" not in a.help))]
    assert not missing, missing


def test_export_refuses_a_file_and_a_converted_dir_and_drops_stale_weights(tmp_path):
    """An export never replaces a file, nor a converted (Orbax) checkpoint dir, whose params/ a load would read
    instead of the exported weights (as `convert --overwrite` never replaces another kind's dir); an mtp.safetensors
    of an earlier model does not survive an export (it holds weights, like the shards it replaces)."""
    from convert.hf import load_target
    from convert.store import load_model, save_converted
    from jaxspec.export import export_drafter, export_target
    model, other = tiny_target(0), tiny_target(1)
    (tmp_path / "notes.txt").write_text("precious")
    for export in (lambda out: export_target(model, out), lambda out: export_drafter(tiny_drafter(), out,
                                                                                      num_target_layers=4)):
        with pytest.raises(FileExistsError, match="it is a file") as e:
            export(tmp_path / "notes.txt")
        assert str(tmp_path / "notes.txt") in str(e.value) and (tmp_path / "notes.txt").read_text() == "precious"
        with pytest.raises(NotADirectoryError, match=r"cannot be created: .*notes.txt is not a directory"):
            export(tmp_path / "notes.txt" / "sub")
    export_target(model, tmp_path / "hf")
    conv = save_converted(load_target(tmp_path / "hf"), tmp_path / "conv", tmp_path / "hf")
    before = sorted(p.name for p in conv.iterdir())
    with pytest.raises(FileExistsError, match=r"holds a converted checkpoint \(jaxspec.json, params/\)") as e:
        export_target(other, conv)
    assert str(conv) in str(e.value) and sorted(p.name for p in conv.iterdir()) == before
    a, b = _bits(model), _bits(load_model(conv))
    assert all(np.array_equal(a[k], b[k]) for k in a)             # still the converted weights, and readable
    (tmp_path / "dconv" / "params").mkdir(parents=True)            # a converted drafter dir
    (tmp_path / "dconv" / "jaxspec.json").write_text('{"format": "jaxspec-drafter"}')
    with pytest.raises(FileExistsError, match=r"holds a converted checkpoint \(jaxspec.json, params/\)"):
        export_drafter(tiny_drafter(), tmp_path / "dconv", num_target_layers=4)
    assert sorted(p.name for p in (tmp_path / "dconv").iterdir()) == ["jaxspec.json", "params"]
    for name, export in (("t", lambda out: export_target(other, out)),
                         ("d", lambda out: export_drafter(tiny_drafter(), out, num_target_layers=4))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mtp.safetensors").write_bytes(b"an earlier model's head")
        (tmp_path / name / "tokenizer.json").write_text("{}")
        export(tmp_path / name)
        names = {p.name for p in (tmp_path / name).iterdir()}
        assert "tokenizer.json" in names and "mtp.safetensors" not in names, names


def _tp_shape(**kw):
    """The tiny target with 4 query heads over 2 kv heads, 4 GDN key heads and a vocabulary no degree divides:
    tp 4 repeats the kv heads, tp 2 splits them, and both pad the vocabulary."""
    cfg = train.tiny_sizes().target.replace(num_heads=4, num_kv_heads=2, linear_num_key_heads=4,
                                            linear_num_value_heads=4, vocab_size=321, **kw)
    return Qwen35(cfg, rngs=nnx.Rngs(5))


@pytest.mark.parametrize("tp", [4, 2])
def test_export_of_a_tensor_parallel_target_is_the_unsharded_checkpoint(tmp_path, tp):
    """export_target of sharding.shard_target(m, mesh) writes m's own checkpoint: kv heads not repeated,
    vocabulary not padded, config.json that of m; it loads back (unsharded) bit for bit."""
    from convert.hf import load_target
    from jaxspec import sharding as S
    from jaxspec.export import export_target
    model = _tp_shape()
    sharded = S.shard_target(model, S.make_mesh(tp, 1))
    assert sharded.cfg != model.cfg                                 # the tp layout: padded (and repeated at 4)
    export_target(sharded, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["num_key_value_heads"] == 2 and hf["vocab_size"] == 321
    back = load_target(tmp_path)
    assert back.cfg == model.cfg
    assert_same_bits(model, back)


def test_export_of_a_tensor_parallel_drafter_is_the_unsharded_checkpoint(tmp_path):
    from convert.drafter import load_drafter
    from jaxspec import sharding as S
    from jaxspec.export import export_drafter
    model = tiny_drafter(scale=True)
    sharded = S.shard_drafter(model, S.make_mesh(2, 1))
    assert sharded.cfg.num_kv_heads == 2 and model.cfg.num_kv_heads == 1
    export_drafter(sharded, tmp_path, num_target_layers=4)
    back = load_drafter(tmp_path)
    assert back.cfg == model.cfg
    assert_same_bits(model, back)


def test_a_misspelt_flag_ends_with_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("JAXSPEC_LOOP_GRAPH", "none")
    assert train.main(["eval", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "d"), "--text", "x",
                       "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: environment variable JAXSPEC_LOOP_GRAPH is set") and "JAXSPEC_LOOP_GRAPHS?" in err
