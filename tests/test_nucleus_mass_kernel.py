"""Top-p's search pass (pallas_kernels/nucleus_mass) against its reference, and in jaxspec.sampling's search.

CPU: the kernel in interpret mode on fresh random rows (ragged vocabularies, one tile or many, 1 to 16
thresholds, leading batch dims, ties between keys and thresholds, the thresholds 0 and 2^32 - 1); the Triton
lowering at the real vocabulary for an abstract H200; the search through the kernel equal to the sorted cut.
GPU (`-m gpu`): the compiled kernel at the real vocabulary; the search with no flag (the kernel, the GPU default)
equal to the sorted cut there. Bound: the sums' relative error < 1e-5 (fp32; only
their order of addition differs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_tests import check_dispatch, on_gpu
from pallas_kernels.nucleus_mass import api, pallas_triton, reference


def make_inputs(seed, lead, vocab, width):
    """Rows of logits (scale 4, some -inf), their keys and masses, and thresholds: random keys, keys of entries
    of the row (a tie is not above), 0 (all the mass) and 2^32 - 1 (none)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(lead + (vocab,)) * 4).astype(np.float32)
    x[rng.random(x.shape) < 0.05] = -np.inf
    x = jnp.asarray(x)
    key = reference.ordered_key(x)
    e = jnp.exp(x - jnp.max(x, -1, keepdims=True))
    t = rng.integers(0, 2 ** 32, lead + (width,), dtype=np.uint64).astype(np.uint32)
    flat_key, flat_t = np.asarray(key).reshape(-1, vocab), t.reshape(-1, width)
    for r in range(flat_t.shape[0]):
        flat_t[r, : width // 2] = flat_key[r, rng.integers(0, vocab, width // 2)]
    flat_t[0, 0], flat_t[-1, -1] = 0, 2 ** 32 - 1
    return key, e, jnp.asarray(t)


def assert_matches(out, ref):
    assert out.shape == ref.shape and out.dtype == ref.dtype == jnp.float32, (out.shape, ref.shape, out.dtype)
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    np.testing.assert_array_equal(out == 0, ref == 0)
    err = float((np.abs(out - ref) / np.maximum(ref, 1e-30)).max())
    assert err < 1e-5, f"relative error {err:.2e}"


@pytest.mark.parametrize("lead,vocab,width", [((1,), 100, 15), ((3,), 5000, 16), ((2, 3), 4097, 1),
                                              ((5,), 1024, 3), ((2,), 9000, 8)])
def test_kernel_matches_reference(seed, lead, vocab, width):
    key, e, t = make_inputs(seed, lead, vocab, width)
    out = api.mass_above(key, e, t, implementation="pallas_interpret")
    assert_matches(out, reference.mass_above(key, e, t))
    assert float(out.reshape(-1, width)[0, 0]) > 0 and float(out.reshape(-1, width)[-1, -1]) == 0.0


@pytest.mark.parametrize("block_v,splits", [(256, 1), (256, 7), (512, 3), (2048, None)])
def test_kernel_tuning_variants(seed, block_v, splits):
    """Tiles and splits that leave ragged tails and empty programs (7 splits of 5000 in tiles of 256)."""
    key, e, t = make_inputs(seed, (4,), 5000, 15)
    out = api.mass_above(key, e, t, implementation="pallas_interpret", block_v=block_v, splits=splits)
    assert_matches(out, reference.mass_above(key, e, t))


def test_dispatch(monkeypatch):
    check_dispatch(api, monkeypatch, gpu_default="pallas_triton")


@pytest.mark.parametrize("impl", ["pallas_interpret", "reference"])
@pytest.mark.parametrize("case,name", [("key int32", "key"), ("e short", "e"), ("e bf16", "e"),
                                       ("t rows", "t"), ("t int32", "t"), ("t flat", "t")])
def test_api_refuses_mismatched_arguments(case, name, impl):
    key, e, t = make_inputs(0, (3,), 64, 4)
    key, e, t = {"key int32": (key.astype(jnp.int32), e, t), "e short": (key, e[:, :32], t),
                 "e bf16": (key, e.astype(jnp.bfloat16), t), "t rows": (key, e, t[:2]),
                 "t int32": (key, e, t.astype(jnp.int32)), "t flat": (key, e, t[0])}[case]
    with pytest.raises(ValueError, match=f"^mass_above: {name} "):
        api.mass_above(key, e, t, implementation=impl)


@pytest.mark.parametrize("impl", ["pallas_interpret", "reference"])
@pytest.mark.parametrize("lead,vocab,width", [((0,), 64, 4), ((2,), 64, 0)])
def test_api_empty(impl, lead, vocab, width):
    """No rows or no thresholds: empty sums (the kernel's grid or blocks would be empty)."""
    key, e, _ = make_inputs(0, (1,), vocab, 1)
    key, e = jnp.broadcast_to(key, lead + (vocab,)), jnp.broadcast_to(e, lead + (vocab,))
    out = api.mass_above(key, e, jnp.zeros(lead + (width,), jnp.uint32), implementation=impl)
    assert out.shape == lead + (width,) and out.dtype == jnp.float32


def test_sampling_search_runs_the_flag_and_keeps_the_reference_under_a_mesh(monkeypatch):
    """jaxspec.sampling's top-p search runs each pass through the op: the kernel when JAXSPEC_NUCLEUS_MASS picks it
    (the loop's pass, traced once for its 9 passes at 16 ways), the reference under a mesh (the kernel would see
    one shard's rows whole), where a misspelt flag is refused all the same."""
    from jaxspec.sampling import searched_nucleus_cut
    calls, kernel = [], pallas_triton.mass_above
    monkeypatch.setattr(pallas_triton, "mass_above", lambda *a, **kw: calls.append(a[2].shape) or kernel(*a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 300)).astype(np.float32))
    jax.jit(searched_nucleus_cut, static_argnums=(1, 2)).trace(x, 0.9, 16)
    assert calls == [(3, 16)], calls
    calls.clear()
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with jax.set_mesh(mesh):
        jax.jit(searched_nucleus_cut, static_argnums=(1, 2)).trace(x, 0.9, 16)
        assert calls == []
        monkeypatch.setenv(api.ENV_VAR, "pallas_tritn")
        with pytest.raises(ValueError, match="JAXSPEC_NUCLEUS_MASS='pallas_tritn'"):
            jax.jit(searched_nucleus_cut, static_argnums=(1, 2)).trace(x[:2], 0.9, 16)   # a new trace


@pytest.mark.parametrize("rows", [15, 64])
def test_triton_lowering(rows):
    """The compiled path's lowering to Triton IR at the real vocabulary (248,320) and 15 thresholds (padded to
    16) for an abstract H200."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    S = jax.ShapeDtypeStruct
    shapes = (S((rows, 248320), jnp.uint32), S((rows, 248320), jnp.float32), S((rows, 15), jnp.uint32))
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda *a: api.mass_above(*a, implementation="pallas_triton"))
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1


@on_gpu
@pytest.mark.parametrize("rows,width", [(15, 15), (64, 15), (64, 1), (3, 8)])
def test_gpu_kernel_matches_reference(seed, rows, width):
    key, e, t = make_inputs(seed, (rows,), 248320, width)
    out = jax.jit(lambda *a: api.mass_above(*a, implementation="pallas_triton"))(key, e, t)
    assert_matches(out, jax.jit(reference.mass_above)(key, e, t))


@on_gpu
@pytest.mark.parametrize("rows", [15, 64])
def test_gpu_default_search_keeps_the_nucleus(monkeypatch, rows):
    """jaxspec.sampling's search with no flag runs the kernel on a GPU, and its cut at the real vocabulary is a
    value of the row whose float64 mass strictly above is < top_p and at or above >= top_p (the nucleus' smallest
    kept value, up to the fp32 sums' rounding: 1e-6), on rows of tied values as logits rounded to bf16 have."""
    from jaxspec.sampling import searched_nucleus_cut
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    assert api.resolve() == "pallas_triton"
    rng = np.random.default_rng(rows)
    x = (rng.standard_normal((rows, 248320)) * 3).astype(jnp.bfloat16).astype(np.float32)
    p64 = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    p64 /= p64.sum(-1, keepdims=True)
    for p in (0.3, 0.9, 0.99):
        cut = np.asarray(jax.jit(searched_nucleus_cut, static_argnums=(1, 2))(jnp.asarray(x), p, 16))
        assert (x == cut).any(-1).all(), f"top_p {p}: a cut is not a value of its row"
        above, at = (p64 * (x > cut)).sum(-1), (p64 * (x >= cut)).sum(-1)
        assert (above < p + 1e-6).all() and (at >= p - 1e-6).all(), (p, above.max(), at.min())
