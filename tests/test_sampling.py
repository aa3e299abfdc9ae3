"""The sampling transform (jaxspec/sampling.py) against transformers' own logits warpers (temperature, then top-k,
then top-p, as `generate` applies them), with the vocabulary top-k by sorting and by counting (the GPU's way), and
the sort-free top-p cut against the sorted one on rows full of ties."""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from jaxspec.ddtree import TOP_K_ENV
from jaxspec.sampling import Sampling, categorical, choose, log_probs, nucleus_cut, searched_nucleus_cut


def warped(logits: np.ndarray, s: Sampling) -> np.ndarray:
    scores = torch.from_numpy(logits)
    steps = [TemperatureLogitsWarper(s.temperature)]
    steps += [TopKLogitsWarper(s.top_k)] if s.top_k else []
    steps += [TopPLogitsWarper(s.top_p)] if s.top_p < 1.0 else []
    for step in steps:
        scores = step(None, scores)
    return torch.log_softmax(scores, -1).numpy()


CASES = [Sampling(0.7, 20), Sampling(1.3, top_p=0.9), Sampling(0.6, 20, 0.95), Sampling(1.0, 50, 0.5),
         Sampling(0.8, top_p=0.3), Sampling(1.0, 4999, 0.99), Sampling(2.0, 1)]


@pytest.mark.parametrize("method", ["sort", "count"])
@pytest.mark.parametrize("s", CASES, ids=str)
def test_log_probs_equal_transformers_warpers(monkeypatch, method, s):
    """Fresh random logits over 5000 tokens (so the staged top-k cuts the row into chunks): the same kept tokens
    as transformers' warpers and the same log-probabilities; top-p cuts between 1 and ~4000 tokens here. "count"
    runs the transform as a GPU does (counted top-k, top-p alone searched 15 thresholds a pass, each pass through
    pallas_kernels/nucleus_mass's kernel, here in interpret mode)."""
    monkeypatch.setenv(TOP_K_ENV, method)
    if method == "count":
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        monkeypatch.setenv("JAXSPEC_NUCLEUS_MASS", "pallas_interpret")
    rng = np.random.default_rng(zlib.crc32(f"{method} {s}".encode()))
    logits = (rng.standard_normal((6, 5000)) * rng.uniform(0.5, 4.0, (6, 1))).astype(np.float32)
    want = warped(logits, s)
    got = np.asarray(jax.jit(lambda x: log_probs(x, s))(jnp.asarray(logits)))
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=2e-5, atol=2e-5)
    kept = np.isfinite(want).sum(-1)
    assert (kept >= 1).all() and (kept <= (s.top_k or 5000)).all(), kept


@pytest.mark.parametrize("method", ["sort", "count"])
def test_top_k_keeps_every_tie_of_the_kth_value(monkeypatch, method):
    """Logits with many equal values (bf16 logits have them): every token equal to the k-th largest stays, as with
    transformers' warper, so more than k may."""
    monkeypatch.setenv(TOP_K_ENV, method)
    rng = np.random.default_rng(7)
    logits = np.round(rng.standard_normal((8, 3000)) * 3).astype(np.float32)
    for k in (1, 7, 40):
        s = Sampling(1.0, k)
        want = warped(logits, s)
        got = np.asarray(log_probs(jnp.asarray(logits), s))
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
        assert (np.isfinite(got).sum(-1) > k).any()
        np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["reference", "pallas_interpret"])
@pytest.mark.parametrize("ways", [2, 5, 16])
def test_searched_cut_equals_the_sorted_cut(ways, impl, monkeypatch):
    """Rows of tied integers, -inf entries, -0.0 beside 0.0, a row whose top entry alone passes top_p: the
    search's cut is the sorted cumulative sum's, value for value, whether it bisects (a CPU's way) or tries 4 or 15
    thresholds a pass (a GPU's), with each pass's sums from the jnp reference or the kernel
    (pallas_kernels/nucleus_mass); and top-k then top-p keeps what the search keeps of the top-k cut."""
    from pallas_kernels.nucleus_mass import pallas_triton
    monkeypatch.setenv("JAXSPEC_NUCLEUS_MASS", impl)
    traced = []
    kernel = pallas_triton.mass_above
    monkeypatch.setattr(pallas_triton, "mass_above", lambda *a, **kw: traced.append(1) or kernel(*a, **kw))
    rng = np.random.default_rng(3)
    x = np.round(rng.standard_normal((12, 700)) * 2).astype(np.float32)
    x[0, :350] = -np.inf
    x[1] = 0.0
    x[1, ::3] = -0.0
    x[2, 5] = 40.0
    x[3, :699] = -np.inf
    x = jnp.asarray(x)
    srt = jnp.sort(x, -1)[..., ::-1]
    for p in (0.05, 0.3, 0.5, 0.8, 0.95, 0.999):
        want = nucleus_cut(srt, jnp.exp(srt - srt[..., :1]).sum(-1, keepdims=True), p)
        # A function of its own per call: the flag is read when tracing, so no trace of another case may be reused
        # (jax.jit of searched_nucleus_cut itself would share one cache across the test's cases).
        got = jax.jit(lambda x, p=p: searched_nucleus_cut(x, p, ways))(x)
        np.testing.assert_array_equal(got, want, err_msg=f"top_p {p}")
    assert float(got[2, 0]) == 40.0 and float(got[3, 0]) == float(x[3, 699])
    assert bool(traced) == (impl == "pallas_interpret"), "the jitted search ran another implementation's sums"
    # Top-k then top-p takes its cut from the k candidates alone; the k-th value's ties beyond them still count.
    for k in (3, 40):
        kth = jax.lax.top_k(x, k)[0][..., -1:]
        cut_k = jnp.where(x < kth, -jnp.inf, x)
        for p in (0.3, 0.8, 0.95):
            kept = jnp.isfinite(log_probs(x, Sampling(1.0, k, p)))
            np.testing.assert_array_equal(kept, x >= searched_nucleus_cut(cut_k, p, ways), err_msg=f"k {k}, top_p {p}")


def test_sampled_choice_follows_the_cut_distribution():
    """choose() draws from the transformed distribution: frequencies over 20000 draws per setting."""
    logits = jnp.log(jnp.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))
    for s, want in ((Sampling(1.0, top_p=0.7), [0.4, 0.25, 0.15, 0, 0, 0]),
                    (Sampling(1.0, 4, 0.9), [0.4, 0.25, 0.15, 0.1, 0, 0])):
        draws = choose(jax.random.key(0), jnp.broadcast_to(logits, (20000, 6)), s)
        freq = np.bincount(np.asarray(draws), minlength=6) / 20000
        np.testing.assert_allclose(freq, np.asarray(want) / sum(want), atol=0.015)


def test_categorical_ignores_padding_and_samples_softmax():
    """A row padded with -inf columns (as a tensor-parallel vocabulary is) draws the same tokens; rows draw
    independently; 40000 draws follow softmax(logits) within 5 binomial standard deviations."""
    key = jax.random.key(11)
    x = jax.random.normal(jax.random.key(12), (4, 3, 509)) * 2
    padded = jnp.pad(x, [(0, 0), (0, 0), (0, 3)], constant_values=-jnp.inf)
    np.testing.assert_array_equal(categorical(key, x), categorical(key, padded))
    assert categorical(key, x).shape == (4, 3) and categorical(key, x).dtype == jnp.int32
    logits = jnp.asarray([1.5, 0.2, -jnp.inf, 0.9, -1.0])
    draws = np.asarray(categorical(jax.random.key(13), jnp.broadcast_to(logits, (40000, 5))))
    freq, p = np.bincount(draws, minlength=5) / len(draws), np.asarray(jax.nn.softmax(logits))
    assert freq[2] == 0 and (np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / len(draws)) + 1e-9).all(), (freq, p)
    rows = np.asarray(categorical(key, jnp.zeros((64, 1000))))
    assert (rows != rows[0]).mean() > 0.9


@pytest.mark.parametrize("s", [Sampling(0.6, 20, 0.95), Sampling(0.7, top_p=0.9), Sampling(1.0, 20)], ids=str)
def test_log_probs_sort_nothing_vocabulary_wide(s):
    """The compiled transform has no sort of a whole row: top-k is XLA's TopK (a partial sort on the CPU) and
    top-p a search or a cut from the k candidates. (Slicing lax.top_k's values twice made XLA's CPU backend
    sort the whole row instead: bench/results/2026-12-05-cpu-s48-sampling/.)"""
    hlo = jax.jit(lambda x: log_probs(x, s)).lower(jnp.zeros((4, 5000))).compile().as_text()
    assert not [line for line in hlo.splitlines() if " sort(" in line and "5000]" in line.split(" sort(")[0]]
