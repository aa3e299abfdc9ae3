"""The fused residual add + RMSNorm (pallas_kernels/add_rms_norm) against its reference, in the model
and per shard.

CPU: the kernel in interpret mode on fresh random rows (the real width 5120 in bf16, small widths in
fp32, one row to a tree of 65), its three outputs (x + u, h, the row scale) each against the reference's;
h times the row scale against RMSNorm in float64; the Triton lowering at the real width for an abstract H200; the model's
forward through it. GPU (`-m gpu`): the compiled kernel. Bounds: max |x - ref| / max |ref| < 1e-5 in
fp32, 1e-2 in bf16.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_tests import check_dispatch, on_gpu
from pallas_kernels.add_rms_norm import api, pallas_triton, reference
from pallas_kernels.add_rms_norm.arg_specs import make_inputs


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


def test_chunks():
    assert [pallas_triton.chunk_of(d) for d in (5120, 4096, 256, 96, 64)] == [1024, 1024, 256, 32, 64]


def test_dispatch(monkeypatch):
    check_dispatch(api, monkeypatch)                   # opt-in until it is faster on the GPU


@pytest.mark.parametrize("impl", ["pallas_interpret", "reference"])
@pytest.mark.parametrize("case,name", [("u broadcast", "u"), ("u other shape", "u"), ("u float32", "u"),
                                       ("w short", "w"), ("w long", "w"), ("w 2-d", "w")])
def test_api_refuses_mismatched_arguments(case, name, impl):
    """The kernel reads u row for row and w over D, and writes x's dtype where the reference promoted: a broadcast
    u, a w of another width or a u of another dtype is refused by name on every path (the kernel ran them)."""
    x, u, w = make_inputs(0, (3, 64), jnp.bfloat16)
    u, w = {"u broadcast": (u[:1], w), "u other shape": (u.reshape(6, 32), w), "u float32": (u.astype(jnp.float32), w),
            "w short": (u, w[:32]), "w long": (u, jnp.concatenate([w, w])),
            "w 2-d": (u, w[None])}[case]
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
    monkeypatch.setattr(pallas_triton, "add_rms_norm", lambda x, *a, **kw: calls.append(x.shape) or kernel(x, *a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    logits, tapped = f()
    assert len(calls) == 2 * len(target.layers) - 1, calls
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


@on_gpu
@pytest.mark.parametrize("shape,dtype", [((1, 1, 5120), jnp.bfloat16), ((1, 65, 5120), jnp.bfloat16),
                                         ((2, 16, 5120), jnp.float32)])
def test_gpu_kernel_matches_reference(seed, shape, dtype):
    args = make_inputs(seed, shape, dtype)
    out = jax.jit(lambda *a: pallas_triton.add_rms_norm(*a, eps=1e-6, offset=1.0))(*args)
    assert_matches(out, jax.jit(lambda *a: reference.add_rms_norm(*a, eps=1e-6, offset=1.0))(*args), dtype)
