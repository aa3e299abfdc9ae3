"""The verify op (pallas_kernels/verify): the target's choice per node from logits [..., V].

CPU: the Pallas kernel in interpret mode equals its jnp twin (reference.gumbel_choice) exactly, greedy
equals jnp.argmax exactly (ties included), the Gumbel-max sample has the distribution softmax(logits/T),
the Triton lowering for an abstract H200 at the real vocabulary, the dispatch, and the engine path.
GPU (`-m gpu`): the compiled kernel at the real vocabulary (V = 248320).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.verify import api, pallas_triton, reference
from kernel_tests import on_gpu

REAL_VOCAB = 248320


def logits_for(seed, rows, vocab, dtype=jnp.float32, ties=False):
    x = 3.0 * jax.random.normal(jax.random.key(seed), (rows, vocab), jnp.float32)
    if ties:                       # few distinct values: many ties for the maximum
        x = jnp.round(x / 3.0)
    return x.astype(dtype)


def interpret(seed_words, x, t, **kw):
    return pallas_triton.gumbel_choice(seed_words, x, t, interpret=True, **kw)


# ---------------------------------------------------------------------------------------------- CPU

@pytest.mark.parametrize("rows,vocab,block_v,splits", [(3, 1000, 256, 3), (2, 4099, 512, None), (1, 77, 2048, 2),
                                                       (5, 300, 64, 7)])
@pytest.mark.parametrize("ties", [False, True])
def test_greedy_is_argmax(seed, rows, vocab, block_v, splits, ties):
    x = logits_for(seed, rows, vocab, ties=ties)
    out = interpret(jnp.zeros((2,), jnp.uint32), x, 0.0, block_v=block_v, splits=splits)
    np.testing.assert_array_equal(out, jnp.argmax(x, -1))


def test_greedy_bf16_and_masked_vocab(seed):
    """bf16 logits (ties are common) and -inf columns (a tensor-parallel padded vocabulary)."""
    x = logits_for(seed, 4, 3000, jnp.bfloat16, ties=True).at[:, 2900:].set(-jnp.inf)
    x = x.at[0, :2900].set(-jnp.inf)                                          # a row with nothing finite
    out = interpret(jnp.zeros((2,), jnp.uint32), x, 0.0, block_v=256, splits=4)
    np.testing.assert_array_equal(out, jnp.argmax(x, -1))


@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.7])
@pytest.mark.parametrize("rows,vocab", [(3, 1000), (4, 4099), (1, 40)])
def test_sample_is_its_jnp_twin(seed, temperature, rows, vocab):
    x = logits_for(seed, rows, vocab)
    words = reference.seed_words(jax.random.key(seed))
    out = interpret(words, x, temperature, block_v=512, splits=3)
    np.testing.assert_array_equal(out, reference.gumbel_choice(words, x, temperature))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("splits", [1, 5, 16])
def test_bench_split_variants_choose_what_the_op_chooses(seed, temperature, splits):
    """The bench's `--splits` rows time the kernel with other splits: the same tokens as the op (jnp twin)."""
    from pallas_kernels.verify.bench import variant
    x, key = logits_for(seed, 3, 4099), jax.random.key(seed)
    got = variant(key, x, temperature, splits=splits, interpret=True)
    np.testing.assert_array_equal(got, api.target_choice(key, x, temperature, implementation="xla"))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_slices_combine_into_the_whole_row(seed, temperature):
    """The bests of column slices (global row/column origins: a sharded vocabulary), combined first-on-ties
    in column order, equal the whole row's choice; the kernel's partial equals its jnp twin's."""
    x = logits_for(seed, 6, 1200, ties=True).at[1].set(-jnp.inf).at[2, 400:].set(-jnp.inf)
    words = reference.seed_words(jax.random.key(seed))
    whole = reference.gumbel_choice(words, x, temperature)
    for row_cut, parts in ((6, 4), (3, 3)):
        vals, idxs = [], []
        for c0 in range(0, 1200, 1200 // parts):
            v_r, i_r = [], []
            for r0 in range(0, 6, row_cut):
                sl = x[r0:r0 + row_cut, c0:c0 + 1200 // parts]
                v, i = reference.gumbel_partial(words, sl, temperature, r0, c0)
                kv, ki = pallas_triton.gumbel_partial(words, sl, temperature, r0, c0, interpret=True, block_v=128,
                                                      splits=2)
                np.testing.assert_array_equal(ki, i)
                np.testing.assert_array_equal(kv, v)
                v_r.append(v), i_r.append(i)
            vals.append(jnp.concatenate(v_r)), idxs.append(jnp.concatenate(i_r))
        _, best = pallas_triton.combine(jnp.stack(vals, 1), jnp.stack(idxs, 1))
        np.testing.assert_array_equal(best, whole)


def test_sample_distribution(seed):
    """Gumbel-max with the hash's noise samples softmax(logits / T): 40000 rows of the same logits
    (independent noise per row) against the exact probabilities, and against jax.random.categorical."""
    probs_at = lambda t: np.asarray(jax.nn.softmax(jnp.asarray([2.0, 1.0, 0.5, 0.0, -1.0, -jnp.inf, 1.5]) / t))
    for i, t in enumerate((0.7, 1.3)):
        x = jnp.broadcast_to(jnp.asarray([2.0, 1.0, 0.5, 0.0, -1.0, -jnp.inf, 1.5]), (40000, 7))
        draws = np.asarray(reference.gumbel_choice(reference.seed_words(jax.random.key(seed + i)), x, t))
        freq = np.bincount(draws, minlength=7) / len(draws)
        p = probs_at(t)
        assert freq[5] == 0
        # 5 standard deviations of a binomial frequency
        assert (np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / len(draws)) + 1e-9).all(), (freq, p)


def test_sample_seeds(seed):
    """A seed gives the same draws again; another seed other draws; rows are independent."""
    x = jnp.zeros((64, 1000))
    a = reference.gumbel_choice(reference.seed_words(jax.random.key(seed)), x, 1.0)
    b = reference.gumbel_choice(reference.seed_words(jax.random.key(seed)), x, 1.0)
    c = reference.gumbel_choice(reference.seed_words(jax.random.key(seed + 1)), x, 1.0)
    np.testing.assert_array_equal(a, b)
    assert (np.asarray(a) != np.asarray(c)).mean() > 0.9
    assert len(set(np.asarray(a).tolist())) > 55


def test_dispatch(monkeypatch, seed):
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    assert api.resolve() == "reference"
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert api.resolve() == "pallas_triton"                # the kernel is the default on GPU
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    assert api.resolve() == "pallas_interpret" and api.resolve("xla") == "xla"
    monkeypatch.setenv(api.ENV_VAR, "triton")
    with pytest.raises(ValueError, match=api.ENV_VAR):
        api.resolve()
    monkeypatch.undo()
    x = logits_for(seed, 6, 700).reshape(2, 3, 700)
    key = jax.random.key(seed)
    for impl in api.IMPLEMENTATIONS[:2] + ("pallas_interpret",):
        np.testing.assert_array_equal(api.target_choice(key, x, 0.0, implementation=impl), jnp.argmax(x, -1))
    np.testing.assert_array_equal(api.target_choice(key, x, 0.8, implementation="pallas_interpret"),
                                  api.target_choice(key, x, 0.8, implementation="xla"))
    # "reference" draws as jaxspec's other samplers do (reference.categorical)
    np.testing.assert_array_equal(api.target_choice(key, x, 0.8, implementation="reference"),
                                  reference.categorical(key, x / 0.8))


JNP_IMPLS = ("reference", "xla", "pallas_interpret")


def test_greedy_is_the_same_whatever_the_implementation(seed):
    """The api's documented promise, through every implementation: for logits without NaN, argmax with the lowest
    index on ties, -inf and +inf entries included, 0 for a row of only -inf. A NaN row is outside it: the jnp ones
    give the first NaN's index (jnp.argmax), the kernel's choice there is unspecified (not checked)."""
    x = logits_for(seed, 6, 300, ties=True)
    x = x.at[0].set(-jnp.inf).at[1, 5:].set(-jnp.inf).at[2, [7, 250]].set(jnp.inf).at[3, 100:].set(x.max() + 1)
    want = np.asarray(jnp.argmax(x, -1))
    assert want[0] == 0 and want[2] == 7 and want[3] == 100
    for impl in JNP_IMPLS:
        np.testing.assert_array_equal(api.target_choice(None, x, 0.0, implementation=impl), want, err_msg=impl)
    nan = x.at[4, [30, 60]].set(jnp.nan)
    for impl in JNP_IMPLS[:2]:
        assert int(api.target_choice(None, nan, 0.0, implementation=impl)[4]) == 30, impl


@pytest.mark.parametrize("impl", JNP_IMPLS)
def test_api_refuses_bad_temperatures_and_a_missing_key(seed, impl):
    """temperature > 0 without a key drew with a fixed seed ("xla", the kernel) or failed in jax.random; a negative,
    NaN or infinite temperature ran. Both are refused by name, by target_choice and by choice_partial."""
    x, key = logits_for(seed, 3, 100), jax.random.key(seed)
    with pytest.raises(ValueError, match="^target_choice: temperature 0.8 > 0 needs a key"):
        api.target_choice(None, x, 0.8, implementation=impl)
    for t in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"^target_choice: temperature must be >= 0 and finite, got {t}"):
            api.target_choice(key, x, t, implementation=impl)
    if impl != "reference":
        with pytest.raises(ValueError, match="^choice_partial: temperature 0.8 > 0 needs a key"):
            api.choice_partial(None, x, 0.8, implementation=impl)
        with pytest.raises(ValueError, match="^choice_partial: temperature must be >= 0"):
            api.choice_partial(key, x, -0.5, implementation=impl)
    assert api.target_choice(None, x, 0.0, implementation=impl).shape == (3,)      # greedy needs no key


@pytest.mark.parametrize("impl", JNP_IMPLS)
def test_api_empty_rows_and_vocabulary(impl):
    """No rows: the reference's empty [...] int32 (the kernel's split count divided by zero); no vocabulary: a
    ValueError naming the logits, as jnp.argmax refuses an empty row (the others divided by zero)."""
    for shape in ((0, 50), (2, 0, 50)):
        out = api.target_choice(jax.random.key(0), jnp.zeros(shape), 0.8, implementation=impl)
        assert out.shape == shape[:-1] and out.dtype == jnp.int32
    if impl != "reference":
        val, idx = api.choice_partial(None, jnp.zeros((0, 50)), 0.0, implementation=impl)
        assert val.shape == idx.shape == (0,) and idx.dtype == jnp.int32
    with pytest.raises(ValueError, match=r"^target_choice: logits \(2, 0\) must be \[..., V\] with V > 0"):
        api.target_choice(None, jnp.zeros((2, 0)), 0.0, implementation=impl)


def test_choose_goes_through_the_op(seed, monkeypatch):
    """jaxspec.sampling.choose: greedy and temperature-only through the op, top-k / top-p not."""
    from jaxspec.sampling import Sampling, choose

    calls = []
    kernel = pallas_triton.gumbel_partial
    monkeypatch.setattr(pallas_triton, "gumbel_partial", lambda *a, **kw: calls.append(a[2]) or kernel(*a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    x = logits_for(seed, 4, 500).reshape(2, 2, 500)
    key = jax.random.key(seed)
    np.testing.assert_array_equal(choose(key, x, Sampling()), jnp.argmax(x, -1))
    np.testing.assert_array_equal(choose(key, x, Sampling(temperature=0.9)),
                                  api.target_choice(key, x, 0.9, implementation="xla"))
    choose(key, x, Sampling(temperature=0.9, top_k=5))
    assert calls == [0.0, 0.9]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_triton_lowering(temperature, dtype):
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    S = jax.ShapeDtypeStruct
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda s, x: pallas_triton.gumbel_choice(s, x, temperature))
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(S((2,), jnp.uint32), S((65, REAL_VOCAB), jnp.dtype(dtype))).lower(
            lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.parametrize("rows", [1, 2, 16, 63, 64, 65, 300, 1025])
@pytest.mark.parametrize("vocab,block_v", [(REAL_VOCAB, 2048), (151936, 2048), (4099, 512), (1000, 256), (77, 64)])
def test_default_splits_fill_the_sms_and_keep_each_program_short(rows, vocab, block_v):
    """Session 17's sweep (bench/results/2026-12-01-h200-s17-verify): short programs (~4 tiles) win at every row
    count, so the default gives each row enough splits for both, within the cap and one tile a split at least."""
    s = pallas_triton.default_splits(rows, vocab, block_v)
    cap = min(64, vocab // block_v)
    assert 1 <= s <= max(1, cap)
    tiles_each = -(-vocab // (s * block_v))
    assert tiles_each <= pallas_triton.TILES_PER_PROGRAM or s == cap
    assert s * rows >= 2 * pallas_triton.NUM_SMS or s == cap
    if (rows, vocab) == (64, REAL_VOCAB):
        assert s == 31          # 4 splits before the sweep


# ---------------------------------------------------------------------------------------------- GPU

@on_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 16, 65, 1025])
def test_gpu_greedy_is_argmax(seed, rows, dtype):
    x = logits_for(seed, rows, REAL_VOCAB, jnp.dtype(dtype), ties=dtype == "bfloat16")
    out = jax.jit(lambda x: pallas_triton.gumbel_choice(jnp.zeros((2,), jnp.uint32), x, 0.0))(x)
    np.testing.assert_array_equal(out, jax.jit(lambda x: jnp.argmax(x, -1))(x))


@on_gpu
@pytest.mark.parametrize("rows", [1, 65])
def test_gpu_sample_matches_twin(seed, rows):
    """The kernel's draws against the jnp twin's on the GPU: equal, except where the two best scores
    are within float rounding (the GPU's log and XLA's may differ in the last bit)."""
    x = logits_for(seed, rows, REAL_VOCAB)
    words = reference.seed_words(jax.random.key(seed))
    out = np.asarray(jax.jit(lambda s, x: pallas_triton.gumbel_choice(s, x, 0.8))(words, x))
    ref = np.asarray(jax.jit(lambda s, x: reference.gumbel_choice(s, x, 0.8))(words, x))
    diff = np.nonzero(out != ref)[0]
    if diff.size:
        r = jnp.arange(rows, dtype=jnp.uint32)[:, None]
        c = jnp.arange(REAL_VOCAB, dtype=jnp.uint32)[None, :]
        score = np.asarray(x * np.float32(1 / 0.8) + reference.gumbel(words, r, c))
        gap = np.abs(score[diff, out[diff]] - score[diff, ref[diff]])
        assert (gap <= 1e-5 * np.abs(score[diff, ref[diff]])).all(), gap
    assert diff.size <= max(1, rows // 50)


@on_gpu
def test_gpu_sample_distribution(seed):
    x = jnp.broadcast_to(jnp.asarray([2.0, 1.0, 0.5, 0.0, -1.0, 1.5, -0.5, 0.3]), (40000, 8))
    draws = np.asarray(jax.jit(lambda s, x: pallas_triton.gumbel_choice(s, x, 1.0))(
        reference.seed_words(jax.random.key(seed)), x))
    freq = np.bincount(draws, minlength=8) / len(draws)
    p = np.asarray(jax.nn.softmax(x[0]))
    assert (np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / len(draws))).all(), (freq, p)


@on_gpu
def test_gpu_opt_in_dispatch(seed, monkeypatch):
    monkeypatch.setenv(api.ENV_VAR, "pallas_triton")
    x = logits_for(seed, 65, REAL_VOCAB, jnp.bfloat16).reshape(1, 65, REAL_VOCAB)
    fn = jax.jit(lambda k, x: api.target_choice(k, x, 0.0))
    assert fn.lower(jax.random.key(0), x).as_text().count("__gpu$xla.gpu.triton") == 1
    np.testing.assert_array_equal(fn(jax.random.key(0), x), jnp.argmax(x, -1))

