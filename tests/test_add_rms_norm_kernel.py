"""The fused residual add + RMSNorm (pallas_kernels/add_rms_norm) against its reference, in the model
and per shard.

CPU: the kernel in interpret mode on fresh random rows (the real width 5120 in bf16, small widths in
fp32, one row to a tree of 65), the update whole or as a product's K slices, its three outputs (x + u, h, the
row scale) each against the reference's; h times the row scale against RMSNorm in float64; the Triton lowering
at the real width for an abstract H200; the model's forward through it, its products handing over their K slices
(Linear with `slices`, `out_slices`). GPU (`-m gpu`): the compiled kernel. Bounds: max |x - ref| / max |ref| <
1e-5 in fp32, 1e-2 in bf16.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_tests import check_dispatch, on_gpu
from pallas_kernels.add_rms_norm import api, pallas_triton, reference
from pallas_kernels.add_rms_norm.arg_specs import make_inputs, make_slices


def assert_matches(out, ref, dtype):
    bound = 1e-5 if dtype == jnp.float32 else 1e-2
    assert len(out) == len(ref) == 3
    for name, a, r in zip(("sum", "h", "row scale"), out, ref):
        assert a.shape == r.shape and a.dtype == r.dtype, (name, a.shape, r.shape)
        a, r = np.asarray(a, np.float64), np.asarray(r, np.float64)
        err = float(np.abs(a - r).max() / np.abs(r).max())
        assert err < bound, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("offset", [1.0, 0.0])
@pytest.mark.parametrize("shape,dtype", [((1, 1, 5120), jnp.bfloat16), ((2, 65, 5120), jnp.bfloat16),
                                         ((3, 7, 64), jnp.float32), ((2, 5, 96), jnp.float32)])
def test_kernel_matches_reference(seed, shape, dtype, offset):
    args = make_inputs(seed, shape, dtype)
    out = pallas_triton.add_rms_norm(*args, eps=1e-6, offset=offset, interpret=True)
    assert_matches(out, reference.add_rms_norm(*args, eps=1e-6, offset=offset), dtype)


@pytest.mark.parametrize("offset", [1.0, 0.0])
def test_kernel_outputs_are_the_deferred_norm(seed, offset):
    """h * r is RMSNorm(x + u) with weight (offset + w), in float64 from the kernel's own sum (fp32 rows), and the
    row scale is taken with eps inside the root: rows of mean square ~eps (1e-3 scale) and ~1."""
    x, u, w = make_inputs(seed, (2, 5, 96), jnp.float32)
    for scale in (1e-3, 1.0):
        s, h, r = pallas_triton.add_rms_norm(x * scale, u * scale, w, eps=1e-6, offset=offset, interpret=True)
        sd = np.asarray(x * scale, np.float64) + np.asarray(u * scale, np.float64)
        np.testing.assert_allclose(np.asarray(s, np.float64), sd, rtol=1e-6)
        rms = np.sqrt(np.mean(sd * sd, -1, keepdims=True) + 1e-6)
        want = sd / rms * (offset + np.asarray(w, np.float64))
        np.testing.assert_allclose(np.asarray(h, np.float64) * np.asarray(r, np.float64), want, rtol=1e-5,
                                   atol=1e-6 * np.abs(want).max())
        np.testing.assert_allclose(np.asarray(r, np.float64), 1 / rms, rtol=1e-5)


@pytest.mark.parametrize("slices,shape,dtype,udtype", [(8, (1, 16, 5120), jnp.bfloat16, jnp.float32),
                                                       (1, (2, 3, 5120), jnp.bfloat16, jnp.float32),
                                                       (4, (3, 7, 64), jnp.float32, jnp.float32),
                                                       (2, (5, 96), jnp.bfloat16, jnp.bfloat16)])
def test_kernel_with_slices_matches_reference(seed, slices, shape, dtype, udtype):
    x, _, w = make_inputs(seed, shape, dtype)
    u = make_slices(seed, slices, shape, udtype)
    out = pallas_triton.add_rms_norm(x, u, w, eps=1e-6, offset=1.0, interpret=True)
    assert_matches(out, reference.add_rms_norm(x, u, w, eps=1e-6, offset=1.0), dtype)


@pytest.mark.parametrize("impl", ["pallas_interpret", "reference"])
def test_slices_are_summed_in_fp32_and_rounded_once(seed, impl):
    """x + the slices' sum: within half a bf16 step of the float64 sum on every path, where rounding each slice's
    sum to bf16 first (what the product does when whole) lands a step off on some elements."""
    x, _, w = make_inputs(seed, (4, 256), jnp.bfloat16)
    u = make_slices(seed, 8, (4, 256))
    s, _, _ = api.add_rms_norm(x, u, w, eps=1e-6, offset=1.0, implementation=impl)
    exact = np.asarray(x, np.float64) + np.asarray(u, np.float64).sum(0)
    err = np.abs(np.asarray(s, np.float64) - exact) / np.abs(exact)
    assert s.dtype == jnp.bfloat16 and err.max() <= 2 ** -8 * (1 + 1e-3), err.max()     # bf16: 8 bits
    twice = x + jnp.sum(u, 0).astype(jnp.bfloat16)
    assert np.any(np.asarray(twice) != np.asarray(s))


def test_slices_for(monkeypatch):
    """The model asks for the products' K slices only where the kernel runs, for blocks of 1..64 rows."""
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    assert [api.slices_for(n) for n in (1, 16, 64)] == [0, 0, 0]        # the reference on this CPU
    for impl in ("pallas_interpret", "pallas_triton"):
        assert [api.slices_for(n, impl) for n in (0, 1, 16, 64, 65, 1024)] == [0, 8, 8, 8, 0, 0]
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    assert api.slices_for(16) == 8


@pytest.mark.parametrize("d_in,want", [(48, 8), (20, 4), (7, 1)])
def test_linear_slices_sum_to_the_product(seed, d_in, want):
    """Linear(x, slices=8): gcd(8, in) K slices in fp32, [S, ..., out], whose sum is the product."""
    from flax import nnx

    from jaxspec.model import Linear
    lin = Linear(d_in, 24, dtype=jnp.float32, rngs=nnx.Rngs(seed))
    x = jnp.asarray(np.random.default_rng(seed).standard_normal((2, 3, d_in)), jnp.float32)
    with jax.default_matmul_precision("highest"):
        parts = lin(x, slices=8)
        whole = lin(x)
    assert parts.shape == (want, 2, 3, 24) and parts.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(parts.sum(0)), np.asarray(whole), rtol=1e-5, atol=1e-5)
    k = d_in // want
    np.testing.assert_allclose(np.asarray(parts[-1]), np.asarray(x[..., -k:] @ lin.kernel[...][-k:]), rtol=1e-5,
                               atol=1e-5)


def test_no_slices_under_a_mesh(monkeypatch):
    """Under a mesh of several devices the products stay whole (a row-parallel product is summed over the model
    axis; its slices would be gathered), whatever the flag."""
    from jaxspec import sharding
    from jaxspec.model import out_slices
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    assert out_slices(16) == 8 and out_slices(65) == 0
    with jax.set_mesh(sharding.make_mesh(2, 1)):
        assert out_slices(16) == 0
    with jax.set_mesh(sharding.make_mesh(1, 1)):
        assert out_slices(16) == 8


def test_chunks():
    assert [pallas_triton.chunk_of(d) for d in (5120, 4096, 256, 96, 64)] == [512, 512, 256, 32, 64]


def test_dispatch(monkeypatch):
    check_dispatch(api, monkeypatch)                   # opt-in until it is faster on the GPU


@pytest.mark.parametrize("impl", ["pallas_interpret", "reference"])
@pytest.mark.parametrize("case,name", [("u broadcast", "u"), ("u other shape", "u"), ("u float32", "u"),
                                       ("w short", "w"), ("w long", "w"), ("w 2-d", "w"),
                                       ("slices other rows", "u's slices"), ("no slices", "u's slices"),
                                       ("int slices", "u's slices")])
def test_api_refuses_mismatched_arguments(case, name, impl):
    """The kernel reads u row for row and w over D, and writes x's dtype where the reference promoted: a broadcast
    u, a w of another width or a u of another dtype is refused by name on every path (the kernel ran them)."""
    x, u, w = make_inputs(0, (3, 64), jnp.bfloat16)
    u, w = {"u broadcast": (u[:1], w), "u other shape": (u.reshape(6, 32), w), "u float32": (u.astype(jnp.float32), w),
            "w short": (u, w[:32]), "w long": (u, jnp.concatenate([w, w])),
            "w 2-d": (u, w[None]), "slices other rows": (make_slices(0, 2, (4, 64)), w),
            "no slices": (make_slices(0, 1, (3, 64))[:0], w),
            "int slices": (make_slices(0, 2, (3, 64)).astype(jnp.int32), w)}[case]
    with pytest.raises(ValueError, match=f"^add_rms_norm: {name} "):
        api.add_rms_norm(x, u, w, eps=1e-6, offset=1.0, implementation=impl)


@pytest.mark.parametrize("impl", ["pallas_interpret", "reference"])
@pytest.mark.parametrize("shape", [(0, 64), (2, 0, 64)])
def test_api_no_rows(shape, impl):
    """No rows: the reference's empty outputs (the kernel's empty grid failed)."""
    x, u, w = make_inputs(0, shape, jnp.bfloat16)
    s, h, r = api.add_rms_norm(x, u, w, eps=1e-6, offset=1.0, implementation=impl)
    assert s.shape == h.shape == shape and s.dtype == h.dtype == jnp.bfloat16
    assert r.shape == shape[:-1] + (1,) and r.dtype == jnp.float32


@pytest.fixture(scope="module")
def target(tiny_hf):
    from convert.hf import load_target
    return load_target(tiny_hf[0], dtype="float32")


def test_model_forward_through_the_kernel(target, monkeypatch):
    """The model's forward with every residual add + norm through the kernel (interpret mode): the same
    logits and taps as without, and the kernel traced twice per layer but once for the first (its input
    norm has no residual add before it) and the last (no norm after its MLP add)."""
    from flax import nnx

    from jaxspec import tree as trees
    from jaxspec.model import init_state
    tokens = jnp.asarray(np.random.RandomState(3).randint(0, 512, (2, 6)))
    tr = trees.chain(2, 6)
    gd, params = nnx.split(target)
    taps = (0, len(target.layers) - 1)
    f = lambda: jax.jit(lambda p, t, s: nnx.merge(gd, p)(t, s, tr, taps=taps)[:2])(
        params, tokens, init_state(target.cfg, 2, 16))
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    ref_logits, ref_taps = f()
    calls, kernel = [], pallas_triton.add_rms_norm
    monkeypatch.setattr(pallas_triton, "add_rms_norm",
                        lambda x, u, *a, **kw: calls.append((x.shape, u.shape)) or kernel(x, u, *a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    logits, tapped = f()
    assert len(calls) == 2 * len(target.layers) - 1, calls
    # 12 rows: every update arrives as its product's K slices (the tiny model's widths are multiples of 8)
    assert all(u == (8,) + x for x, u in calls), calls
    np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(tapped), np.asarray(ref_taps), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 65])
def test_triton_lowering(rows):
    """The compiled path's lowering to Triton IR at the real width (5120, bf16) for an abstract H200."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    S = jax.ShapeDtypeStruct
    shapes = (S((1, rows, 5120), jnp.bfloat16), S((1, rows, 5120), jnp.bfloat16), S((5120,), jnp.bfloat16))
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda *a: pallas_triton.add_rms_norm(*a, eps=1e-6, offset=1.0))
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.parametrize("slices", [1, 8])
def test_triton_lowering_with_slices(slices):
    """The same with the update as K slices in fp32 (16 rows: a DFlash block)."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    S = jax.ShapeDtypeStruct
    shapes = (S((1, 16, 5120), jnp.bfloat16), S((slices, 1, 16, 5120), jnp.float32), S((5120,), jnp.bfloat16))
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda *a: pallas_triton.add_rms_norm(*a, eps=1e-6, offset=1.0))
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1


@on_gpu
@pytest.mark.parametrize("shape,dtype", [((1, 1, 5120), jnp.bfloat16), ((1, 65, 5120), jnp.bfloat16),
                                         ((2, 16, 5120), jnp.float32)])
def test_gpu_kernel_matches_reference(seed, shape, dtype):
    args = make_inputs(seed, shape, dtype)
    out = jax.jit(lambda *a: pallas_triton.add_rms_norm(*a, eps=1e-6, offset=1.0))(*args)
    assert_matches(out, jax.jit(lambda *a: reference.add_rms_norm(*a, eps=1e-6, offset=1.0))(*args), dtype)


@on_gpu
@pytest.mark.parametrize("slices,shape", [(8, (1, 16, 5120)), (8, (1, 64, 5120)), (8, (1, 1, 5120))])
def test_gpu_kernel_with_slices_matches_reference(seed, slices, shape):
    x, _, w = make_inputs(seed, shape, jnp.bfloat16)
    u = make_slices(seed, slices, shape)
    out = jax.jit(lambda *a: pallas_triton.add_rms_norm(*a, eps=1e-6, offset=1.0))(x, u, w)
    assert_matches(out, jax.jit(lambda *a: reference.add_rms_norm(*a, eps=1e-6, offset=1.0))(x, u, w), jnp.bfloat16)


def test_slices_are_refused_where_they_would_be_lost(seed):
    """Linear refuses a row scale with slices (the scale would be dropped), and the per-shard path refuses slices
    under a mesh (its row split would cut the slice axis): both by name, before any work."""
    from flax import nnx

    from jaxspec import sharding
    from jaxspec.model import Linear
    lin = Linear(16, 8, dtype=jnp.float32, rngs=nnx.Rngs(seed))
    with pytest.raises(ValueError, match="^Linear: row_scale and slices together"):
        lin(jnp.ones((2, 16)), row_scale=jnp.ones((2, 1)), slices=8)
    x, _, w = make_inputs(seed, (2, 3, 64), jnp.float32)
    u = make_slices(seed, 8, (2, 3, 64))
    assert sharding.per_shard_rows(lambda *a: a, x, u, w)[1] is u        # no mesh: fn on the whole arrays
    with jax.set_mesh(sharding.make_mesh(2, 2)):
        with pytest.raises(ValueError, match=r"^per_shard_rows: u \(8, 2, 3, 64\) must be a whole update"):
            sharding.per_shard_rows(lambda *a: a, x, u, w)
