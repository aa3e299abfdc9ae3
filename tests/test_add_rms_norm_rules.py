"""Rules of the fused residual add + RMSNorm (pallas_kernels/add_rms_norm) in its deferred form, checked on fresh
random rows (CPU, the kernel in interpret mode): the rounding of s = x + u, h = s * (offset + w) and the row scale r
in bf16 (kernel and reference bit for bit, and the reference against a numpy definition), the norm's own eps and
offset reaching the kernel through the api and jaxspec.model.add_norm, and per_shard_rows keeping each sequence's
row scale under a (model 4, data 2) mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.add_rms_norm import api, pallas_triton, reference

BF16 = jnp.bfloat16


def rows(seed, shape, dtype, scale=1.0):
    """x (3x the scale of u), u [shape] and w [D] (about 0.1) in dtype, from fresh normal draws."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal(shape) * 3 * scale, jnp.float32).astype(dtype)
    u = jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32).astype(dtype)
    w = jnp.asarray(rng.standard_normal(shape[-1:]) * 0.1, jnp.float32).astype(dtype)
    return x, u, w


def bits(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32))


def spec_bf16(x, u, w, eps, offset):
    """The deferred outputs for bf16 x, u, w written in numpy: s = x + u rounded once to bf16 (the fp32 sum of two
    bf16 values); h = fp32(s) * (offset + fp32(w)) in fp32, rounded once to bf16; r = 1 / sqrt(mean(s^2) + eps) in
    float64 from the rounded s."""
    xf, uf, wf = bits(x), bits(u), bits(w)
    s = jnp.asarray(xf + uf).astype(BF16)
    sf = bits(s)
    h = jnp.asarray(sf * (np.float32(offset) + wf)).astype(BF16)
    sd = sf.astype(np.float64)
    r = 1 / np.sqrt(np.mean(sd * sd, -1, keepdims=True) + eps)
    return s, h, r


@pytest.mark.parametrize("offset", [1.0, 0.0])
@pytest.mark.parametrize("d", [64, 96])
def test_kernel_rounds_as_the_reference_in_bf16(seed, d, offset):
    """bf16 rows through the api's "pallas_interpret" path (the kernel runs, once): s and h are bit for bit the
    reference's (both round s = x + u to bf16 once, and h = s * (offset + w) is taken in fp32 from that rounded s,
    with w and offset + w in fp32, then rounded once); r is fp32 [..., 1] and within 1e-5 of the reference's (the
    sum of squares of the rounded s, summed in another order). Widths: one chunk (64) and three chunks of 32 (96).
    A row scale from the unrounded sum is off by ~1e-3 relative at these widths."""
    x, u, w = rows(seed, (2, 5, d), BF16)
    calls, kernel = [], pallas_triton.add_rms_norm
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pallas_triton, "add_rms_norm", lambda *a, **kw: calls.append(kw["interpret"]) or kernel(*a, **kw))
        s, h, r = api.add_rms_norm(x, u, w, eps=1e-6, offset=offset, implementation="pallas_interpret")
    assert calls == [True]
    rs, rh, rr = reference.add_rms_norm(x, u, w, eps=1e-6, offset=offset)
    assert s.dtype == h.dtype == BF16 and r.dtype == jnp.float32 and r.shape == (2, 5, 1)
    np.testing.assert_array_equal(bits(s), bits(rs))
    np.testing.assert_array_equal(bits(h), bits(rh))
    np.testing.assert_allclose(np.asarray(r, np.float64), np.asarray(rr, np.float64), rtol=1e-5)


@pytest.mark.parametrize("offset", [1.0, 0.0])
def test_reference_rounds_as_its_definition_in_bf16(seed, offset):
    """The reference on bf16 rows against the numpy definition (spec_bf16): s and h bit for bit (h from the
    bf16-rounded s times offset + w in fp32, one rounding to bf16), r within 1e-5 of float64 from the rounded s.
    The row scale of the unrounded sum differs by ~1e-3 relative here; (offset + w) rounded to bf16 changes h."""
    x, u, w = rows(seed, (3, 4, 96), BF16)
    s, h, r = reference.add_rms_norm(x, u, w, eps=1e-6, offset=offset)
    ws, wh, wr = spec_bf16(x, u, w, 1e-6, offset)
    np.testing.assert_array_equal(bits(s), bits(ws))
    np.testing.assert_array_equal(bits(h), bits(wh))
    assert r.dtype == jnp.float32 and r.shape == (3, 4, 1)
    np.testing.assert_allclose(np.asarray(r, np.float64), wr, rtol=1e-5)


@pytest.mark.parametrize("offset,eps", [(0.0, 1e-2), (0.5, 1e-6), (1.0, 3e-2)])
def test_model_add_norm_passes_the_norms_eps_and_offset(seed, monkeypatch, offset, eps):
    """jaxspec.model.add_norm with an RMSNorm of its own eps and offset (not the decoder's 1e-6 and 1.0): through
    the kernel (JAXSPEC_ADD_RMS_NORM=pallas_interpret, traced once) and through the reference path, (s, h, r) in
    that order with h * r = RMSNorm(x + u) in float64 (eps inside the root, weight offset + w). fp32 rows of mean
    square ~1e-2, where eps 1e-2 or 3e-2 changes r by a third or more against eps 1e-6."""
    from jaxspec.model import RMSNorm, add_norm
    d = 64
    x, u, w = rows(seed, (2, 3, d), jnp.float32, scale=0.03)
    norm = RMSNorm(d, eps=eps, offset=offset, dtype=jnp.float32)
    norm.weight.value = w
    sd = np.asarray(x, np.float64) + np.asarray(u, np.float64)
    rms = np.sqrt(np.mean(sd * sd, -1, keepdims=True) + eps)
    want = sd / rms * (offset + np.asarray(w, np.float64))
    calls, kernel = [], pallas_triton.add_rms_norm
    monkeypatch.setattr(pallas_triton, "add_rms_norm", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
    for impl in ("pallas_interpret", "reference"):
        monkeypatch.setenv(api.ENV_VAR, impl)
        s, h, r = add_norm(x, u, norm)
        assert s.shape == h.shape == x.shape and r.shape == (2, 3, 1), impl
        np.testing.assert_allclose(np.asarray(s, np.float64), sd, rtol=1e-6, err_msg=impl)
        np.testing.assert_allclose(np.asarray(r, np.float64), 1 / rms, rtol=1e-5, err_msg=impl)
        np.testing.assert_allclose(np.asarray(h, np.float64) * np.asarray(r, np.float64), want, rtol=1e-5,
                                   atol=1e-6 * np.abs(want).max(), err_msg=impl)
    assert calls == [x.shape]


def test_per_shard_rows_keeps_each_sequences_row_scale(seed, monkeypatch):
    """model.add_norm through the kernel under a (model 4, data 2) mesh, jitted: traced on one sequence's whole rows
    (1, N, D), and s, h, r [2, N, 1] equal the unsharded reference's for both sequences, whose rows are drawn at
    scales 1 and 5 so that one sequence's row scale is far from the other's."""
    from jaxspec import sharding as S
    from jaxspec.model import RMSNorm, add_norm
    d, n = 64, 3
    x, u, w = rows(seed, (2, n, d), jnp.float32)
    scale = jnp.asarray([1.0, 5.0])[:, None, None]
    x, u = x * scale, u * scale
    norm = RMSNorm(d, eps=1e-6, offset=1.0, dtype=jnp.float32)
    norm.weight.value = w
    monkeypatch.setenv(api.ENV_VAR, "reference")
    want = add_norm(x, u, norm)
    shapes, kernel = [], pallas_triton.add_rms_norm
    monkeypatch.setattr(pallas_triton, "add_rms_norm", lambda *a, **kw: shapes.append(a[0].shape) or kernel(*a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    mesh = S.make_mesh(4, 2)
    with jax.set_mesh(mesh):
        got = jax.jit(lambda a, b: add_norm(a, b, norm))(x, u)
    assert shapes == [(1, n, d)], shapes
    for name, g, ref in zip(("s", "h", "r"), got, want):
        assert g.shape == ref.shape and g.dtype == ref.dtype, (name, g.shape, ref.shape)
        np.testing.assert_allclose(np.asarray(g), np.asarray(ref), rtol=1e-5, atol=1e-6, err_msg=name)
