"""The DFlash drafter recipe's rules in jaxspec/train.py, at toy sizes on CPU.

The schedule: past the last scheduled step the learning rate stays at its floor (lr x min_lr_frac), it never climbs
back up the cosine. The loss decay: for a block size the recipe names no gamma for, gamma scales with the block
(7 per 16 slots). The data: each sequence's anchors respect that sequence's own lower bound (the prompt it must
not draft into); corpus windows are a seeded shuffle of all the stream's non-overlapping windows and a stream too
short for one is refused; the target's training batches are whole (seq + 1)-token windows of the stream, the same
at the same step and other ones at other steps, their starts reaching the end of the stream. The loss: a
soft-label weight outside [0, 1] is refused; live features are rounded to float16 as the cache stores them, so
the live loss is the cached one. The feature cache: features of other tap layers or of other windows (another
seed) are made again, never reused; a resumed build makes only the windows not done yet; a cache that saved no
window is made even where the data must not be extended. A resumed Trainer keeps the checkpoint's schedule (its
step count), whatever step count the new one was made with. The held-out split: no file is both trained on and
held out. Prompts: exactly `length` consecutive tokens of one document long enough, from every such document.
The evaluation: acceptance by draft depth stops at the deepest depth a round reached.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxspec import train
from jaxspec.config import FULL
from test_train import _quadratic_trainer, tiny_drafter, tiny_target

# ------------------------------------------------------------------------------------------------
# The optimizer's schedule and the loss decay


def test_learning_rate_stays_at_its_floor_after_the_last_scheduled_step():
    """lr_at past `steps` (a run trained on beyond its schedule) is lr x min_lr_frac, not a cosine climbing back."""
    rng = np.random.default_rng(11)
    for _ in range(4):
        o = train.OptConfig(lr=float(rng.uniform(1e-4, 1e-2)), warmup=int(rng.integers(1, 20)),
                            min_lr_frac=float(rng.uniform(0.05, 0.5)))
        steps = int(rng.integers(40, 200))
        floor = o.lr * o.min_lr_frac
        for step in (steps, steps + 1, steps + steps // 3, 2 * steps - o.warmup, 3 * steps):
            assert float(train.lr_at(step, steps, o)) == pytest.approx(floor, rel=1e-5), (step, steps, o)
        lrs = [float(train.lr_at(s, steps, o)) for s in range(o.warmup, 3 * steps)]
        assert all(b <= a * (1 + 1e-6) for a, b in zip(lrs, lrs[1:]))          # never rises after the warm-up


def test_default_gamma_for_other_block_sizes_scales_with_the_block():
    """The recipe names gamma for B = 16, 10 and 8; for any other block the decay is 7 per 16 slots, so that
    the weights of slots 1..B-1 fall over the block as they do over the recipe's 16."""
    for block in (4, 6, 12, 20, 32):
        gamma = train.default_gamma(block)
        assert gamma == pytest.approx(7.0 * block / 16), block
        w = train.loss_weights(block, gamma)
        assert len(w) == block - 1 and w[0] == pytest.approx(1.0)
        assert w[-1] == pytest.approx(np.exp(-(block - 2) * 16 / (7.0 * block)), rel=1e-6)


# ------------------------------------------------------------------------------------------------
# The drafter's data


def test_each_sequences_anchors_respect_its_own_lower_bound():
    """drafter_batches with a lower bound per sequence (lo [N]): the anchors of each drawn row are >= the bound of
    that very sequence (not of the row's place in the batch) and <= t - B."""
    rng = np.random.default_rng(5)
    n, t, block = 12, 40, 4
    seqs = rng.integers(2, 300, (n, t)).astype(np.int32)
    seqs[:, 0] = 1000 + np.arange(n)                           # each row says which sequence it is
    lo = rng.integers(0, t - block - 3, n)
    lo[::2] = t - block - 3                                    # every other sequence: room for 4 anchors only
    batches = train.drafter_batches(seqs, lo, 8, block, 3, seed=7)
    drawn = set()
    for step in range(10):
        b = batches(step)
        for row, anchors in zip(b["tokens"], b["anchors"]):
            i = int(row[0]) - 1000
            drawn.add(i)
            np.testing.assert_array_equal(row, seqs[i])
            assert (anchors >= lo[i]).all() and (anchors <= t - block).all(), (i, lo[i], anchors)
    assert len(drawn) > n // 2


def test_corpus_windows_are_a_seeded_shuffle_of_every_whole_window():
    """The start of every whole `window`-token window of the stream once (the ragged tail left out), in an order
    that the seed fixes and that is not the stream's, so that any prefix is a sample of the whole corpus."""
    stream = np.random.default_rng(3).integers(2, 300, 50 * 16 + 9).astype(np.int32)
    a, b = train.corpus_windows(stream, 16, seed=4), train.corpus_windows(stream, 16, seed=4)
    np.testing.assert_array_equal(a, b)
    assert sorted(a) == list(range(0, 50 * 16, 16))
    assert not np.array_equal(a, np.sort(a))                  # shuffled
    assert not np.array_equal(a, train.corpus_windows(stream, 16, seed=5))
    first = set(a[:10].tolist())                               # a prefix reaches both halves of the stream
    assert min(first) < 25 * 16 <= max(first)


def test_a_stream_shorter_than_one_window_is_refused():
    """corpus_windows: a stream shorter than one window is refused naming both lengths (no empty data set), while
    a stream of exactly one window gives that window."""
    stream = np.random.default_rng(8).integers(2, 300, 15).astype(np.int32)
    with pytest.raises(ValueError, match="token stream of 15 tokens is shorter than one window of 16"):
        train.corpus_windows(stream, 16, seed=0)
    assert list(train.corpus_windows(stream, 15, seed=0)) == [0]


def test_target_batches_are_whole_windows_fixed_by_the_step_and_reach_the_streams_end():
    """stream_batches: each row is seq + 1 consecutive tokens of the stream; the same step gives the same rows (a
    resumed run sees the interrupted one's batches), other steps other rows; over many steps the starts cover
    the stream up to its last window."""
    seq, n = 12, 60
    stream = np.random.default_rng(9).permutation(np.arange(2, 2 + n)).astype(np.int32)   # distinct tokens
    where = {int(x): i for i, x in enumerate(stream)}
    at = train.stream_batches(stream, 4, seq, seed=2)
    np.testing.assert_array_equal(at(3)["tokens"], at(3)["tokens"])
    assert not np.array_equal(at(3)["tokens"], at(4)["tokens"])
    starts = set()
    for step in range(120):
        toks = at(step)["tokens"]
        assert toks.shape == (4, seq + 1) and toks.dtype == np.int32
        for row in toks:
            s = where[int(row[0])]
            np.testing.assert_array_equal(row, stream[s:s + seq + 1])
            starts.add(s)
    assert starts == set(range(n - seq))        # the last window, ending at the stream's last token, included
    with pytest.raises(ValueError, match="shorter than one sequence"):
        train.stream_batches(stream[:seq], 4, seq, seed=2)


def test_a_stream_of_exactly_one_window_gives_that_window():
    """stream_batches on a stream of exactly seq + 1 tokens: every row is the whole stream (as corpus_windows gives
    the one window of a stream of exactly one window). It was refused as shorter than one window, and a longer
    stream's last window was never drawn."""
    stream = np.random.default_rng(10).integers(2, 300, 9).astype(np.int32)
    np.testing.assert_array_equal(train.stream_batches(stream, 2, 8, seed=0)(0)["tokens"], [stream, stream])


# ------------------------------------------------------------------------------------------------
# The loss


def test_a_soft_label_weight_outside_zero_to_one_is_refused():
    """--soft-labels mixes the greedy label's cross-entropy with the target distribution's: a weight below 0 or
    above 1 is no mixture and is refused, naming it; 0, 1 and any weight in between are taken."""
    dg, _ = nnx.split(tiny_drafter((FULL,), block=4))
    for soft in (-0.25, -1e-3, 1.0 + 1e-3):
        with pytest.raises(ValueError, match=f"soft label weight {soft} is not in"):
            train.drafter_loss_cached(dg, 2.0, soft=soft)
    for soft in (0.0, 0.4, 1.0):
        assert callable(train.drafter_loss_cached(dg, 2.0, soft=soft))


def test_live_features_are_rounded_as_the_cache_stores_them():
    """--features live: the target's taps made inside the step are float16, as the cache stores them, so that the
    live loss is the cached loss on the same tokens and anchors (a drafter of O(1) weights, where the rounding
    shows in the loss)."""
    target, drafter = tiny_target(), tiny_drafter((FULL,), block=4, scale=True)
    tg, tp = nnx.split(target)
    dg, dp = nnx.split(drafter)
    rng = np.random.default_rng(31)
    toks = rng.integers(2, 320, (4, 24)).astype(np.int32)
    anchors = train.sample_anchors(rng, 4, 24, 4, 3, 2)
    taps, greedy = train.target_taps_greedy(target, jnp.asarray(toks), (0, 2))
    assert taps.dtype == jnp.float16 and greedy.dtype == jnp.int32
    frozen = {"embed": target.embed_tokens[...], "lm_head": target.unembedding()}
    cached = train.drafter_loss_cached(dg, 2.0)(dp, frozen, {"tokens": toks, "greedy": np.asarray(greedy),
                                                             "taps": np.asarray(taps, np.float16), "anchors": anchors})
    live = jax.jit(train.drafter_loss_live(dg, tg, (0, 2), 2.0))(dp, {**frozen, "target": tp},
                                                                  {"tokens": toks, "anchors": anchors})
    assert float(live) == pytest.approx(float(cached), rel=1e-6)


# ------------------------------------------------------------------------------------------------
# The feature cache


def _stream(seed, n=200):
    return np.random.default_rng(seed).integers(2, 320, n).astype(np.int32)


def test_features_of_other_tap_layers_are_made_again(tmp_path):
    """A cache made for taps (0, 2) is not reused for taps (1, 3) (the same count, other layers): the build starts
    over, and what it stores is the target's hidden states of the layers asked for."""
    target, stream = tiny_target(), _stream(21)
    cache = train.FeatureCache(tmp_path / "f")
    assert cache.build(target, stream, (0, 2), 24, 6, seed=3, batch=4) == 6
    again = train.FeatureCache(tmp_path / "f")
    assert again.build(target, stream, (1, 3), 24, 6, seed=3, batch=4, deadline=0.0) == 4     # started over
    assert again.meta["taps"] == [1, 3]
    toks, _, taps = (np.asarray(x) for x in again.arrays())
    want, _ = train.target_features_fn(target, (1, 3))(toks[:4])
    np.testing.assert_allclose(taps[:4].astype(np.float32), np.asarray(want, np.float32), rtol=1e-3, atol=1e-3)


def test_features_of_other_windows_are_made_again(tmp_path):
    """Another seed picks other windows of the same stream: a cache of the old seed's windows is made again."""
    target, stream = tiny_target(), _stream(22)
    assert train.FeatureCache(tmp_path / "f").build(target, stream, (0, 2), 24, 6, seed=3, batch=4) == 6
    again = train.FeatureCache(tmp_path / "f")
    assert again.build(target, stream, (0, 2), 24, 6, seed=4, batch=4, deadline=0.0) == 4
    starts = train.corpus_windows(stream, 24, seed=4)[:4]
    np.testing.assert_array_equal(again.arrays()[0][:4], np.stack([stream[s:s + 24] for s in starts]))


def test_a_resumed_feature_build_makes_only_the_windows_not_done(tmp_path, monkeypatch):
    """An interrupted build resumed runs the target only on the windows it had not done, and ends with the
    features a build in one go makes."""
    target, stream = tiny_target(), _stream(23, 260)
    made = []
    real = train.target_features_fn

    def counting(target, tap_ids):
        f = real(target, tap_ids)
        return lambda tokens: made.append(np.asarray(tokens)[:, 0].tolist()) or f(tokens)
    monkeypatch.setattr(train, "target_features_fn", counting)
    cache = train.FeatureCache(tmp_path / "f")
    assert cache.build(target, stream, (0, 2), 24, 10, seed=1, batch=4, deadline=0.0) == 4
    assert len(made) == 1
    made.clear()
    assert train.FeatureCache(tmp_path / "f").build(target, stream, (0, 2), 24, 10, seed=1, batch=4) == 10
    starts = train.corpus_windows(stream, 24, seed=1)[:10]
    assert len(made) == 2                                      # windows 4-7, then 8-9 (padded to the batch)
    assert made[0] == [int(stream[s]) for s in starts[4:8]] and made[1][:2] == [int(stream[s]) for s in starts[8:]]
    whole = train.FeatureCache(tmp_path / "g")
    whole.build(target, stream, (0, 2), 24, 10, seed=1, batch=4)
    for x, y in zip(train.FeatureCache(tmp_path / "f").arrays(), whole.arrays()):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_cache_that_saved_no_window_is_made_even_when_not_extending(tmp_path, monkeypatch):
    """A build killed before it saved any window leaves a cache of none: a rerun that must not extend the data (a
    drafter has begun on it) still makes every window, since no drafter trained on windows that were never made."""
    target, stream = tiny_target(), _stream(24)

    def killed(target, tap_ids):
        raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(train, "target_features_fn", killed)
        with pytest.raises(KeyboardInterrupt):
            train.FeatureCache(tmp_path / "f").build(target, stream, (0, 2), 24, 6, seed=2, batch=4)
    cache = train.FeatureCache(tmp_path / "f")
    assert cache.meta is not None and cache.done == 0
    assert cache.build(target, stream, (0, 2), 24, 6, seed=2, batch=4, extend=False) == 6
    starts = train.corpus_windows(stream, 24, seed=2)[:6]
    np.testing.assert_array_equal(cache.arrays()[0], np.stack([stream[s:s + 24] for s in starts]))
    assert cache.build(target, stream, (0, 2), 24, 6, seed=2, batch=4, extend=False) == 6     # then kept


# ------------------------------------------------------------------------------------------------
# Resume


def test_a_resumed_trainer_keeps_the_checkpoints_schedule(tmp_path):
    """A Trainer made with another step count (as a rerun whose first run calibrated its steps to a time budget)
    resumes on the checkpoint's schedule: its step count, and the losses and weights of the uninterrupted run."""
    scale = np.random.default_rng(4).uniform(0.5, 2.0, 12).astype(np.float32)
    batch_at = lambda step: {"s": scale[step:step + 1]}
    ref = _quadratic_trainer(None, batch_at, steps=12, ckpt_every=0)
    ref.run()
    first = _quadratic_trainer(tmp_path / "ck", batch_at, steps=12, ckpt_every=0)
    first.run(max_steps=5)                                     # "interrupted"; saved on exit
    again = _quadratic_trainer(tmp_path / "ck", batch_at, steps=40, ckpt_every=0)
    assert again.restore() and again.step == 5 and again.steps == 12
    again.run()
    assert again.step == 12
    np.testing.assert_allclose(again.losses, ref.losses, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(again.params["w"]), np.asarray(ref.params["w"]), rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# Files and prompts


def test_no_file_is_both_trained_on_and_held_out():
    """The two-way split: every 20th file (by sorted path) is held out, the rest trained on; no file is in both
    and none is lost. `pair` without unseen prompt files keeps the same held-out files out of the target's text."""
    rng = np.random.default_rng(12)
    files = sorted(f"lib/{''.join(rng.choice(list('abcdefgh'), 6))}_{i}.py" for i in range(87))
    tr, held = train.split_files(files)
    assert held == files[::20] and not set(tr) & set(held) and sorted(tr + held) == files
    tr3, held3, unseen = train.split_files(files, unseen=True)
    assert held3 == held and not set(tr3) & set(held3) and not set(unseen) & set(held3)
    ptr, pheld, prompts = train.pair_files(files, False, ["site/x.py"])
    assert pheld == held and prompts == [] and not set(ptr) & set(pheld) and set(ptr) == set(tr) | {"site/x.py"}


def test_prompts_are_whole_slices_of_documents_long_enough():
    """prompts_from: n prompts of exactly `length` consecutive tokens, each inside one document long enough
    (those shorter than a prompt never used), drawn from every such document; the same for the same seed; none
    long enough is refused."""
    rng = np.random.default_rng(13)
    lengths = [5, 30, 8, 45, 3, 60]
    docs = [(1000 * (i + 1) + np.arange(n)).astype(np.int32) for i, n in enumerate(lengths)]   # doc i, offset
    length = 10
    p = train.prompts_from(docs, 64, length, seed=int(rng.integers(1 << 30)))
    assert p.shape == (64, length) and p.dtype == np.int32
    used = set()
    for row in p:
        d, off = int(row[0]) // 1000 - 1, int(row[0]) % 1000
        np.testing.assert_array_equal(row, docs[d][off:off + length])
        used.add(d)
    assert used == {1, 3, 5}
    np.testing.assert_array_equal(train.prompts_from(docs, 8, length, seed=3), train.prompts_from(docs, 8, length, 3))
    with pytest.raises(ValueError, match="no document longer than 71 tokens"):
        train.prompts_from(docs, 2, 70, seed=0)


# ------------------------------------------------------------------------------------------------
# Evaluation summaries


def test_acceptance_by_depth_stops_at_the_deepest_depth_reached():
    """Depths no round reached give no ratio (not 0/0): hist [0, 3, 2, 0, 0] (5 rounds, 2 of them accepting a
    draft) -> depth 1: P(n >= 2 | n >= 1) = 2/5, depth 2: P(n >= 3 | n >= 2) = 0/2, and nothing for depth 3."""
    assert train.accept_by_depth([0, 3, 2, 0, 0]) == [2 / 5, 0.0]
    hist = np.random.default_rng(14).integers(1, 9, 6)
    got = train.accept_by_depth(np.concatenate([hist, np.zeros(4, int)]))
    assert len(got) == 5 and np.isfinite(got).all()
