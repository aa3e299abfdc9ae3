"""Rules of the update handed to the fused residual add + RMSNorm (pallas_kernels/add_rms_norm) as the K slices of
the product in front (jaxspec.model.Linear with `slices`, model.out_slices), checked on fresh random inputs (CPU, the
kernel in interpret mode): slices of a 16-bit dtype summed in fp32 and rounded once on every path; which slice
counts and widths the kernel takes, the rest running the reference; Linear's slices in fp32 for a bf16 layer; and
which of the model's products hand over slices: blocks of at most 64 rows (batch x nodes) with the kernel chosen,
the one-token GDN step included, and the last layer's MLP product too, but none on the reference path."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.add_rms_norm import api, pallas_triton, reference

BF16 = jnp.bfloat16


def f64(a):
    return np.asarray(jnp.asarray(a).astype(jnp.float32), np.float64)


def draws(seed, slices, shape, dtype):
    """x (scale 1) and `slices` slices of the update (each of scale 1 / sqrt(S)), both in dtype, w [D] ~0.1."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)
    u = jnp.asarray(rng.standard_normal((slices,) + shape) / np.sqrt(slices), jnp.float32).astype(dtype)
    w = jnp.asarray(rng.standard_normal(shape[-1:]) * 0.1, jnp.float32).astype(dtype)
    return x, u, w


@pytest.mark.parametrize("impl", ["pallas_interpret", "reference"])
def test_bf16_slices_are_summed_in_fp32_and_rounded_once(seed, impl):
    """bf16 x with 4 bf16 slices through the api: s is the float64 sum x + u0 + u1 + u2 + u3 rounded once to bf16,
    bit for bit, on both paths (the fp32 sum of five bf16 values of these scales is exact). Summing the slices in
    bf16 rounds after each addition, which puts some elements of s a bf16 step away; that is checked to happen
    on these draws, so that the comparison can tell the two apart. h and r follow from that s."""
    x, u, w = draws(seed, 4, (4, 256), BF16)
    s, h, r = api.add_rms_norm(x, u, w, eps=1e-6, offset=1.0, implementation=impl)
    exact = f64(x) + f64(u).sum(0)
    want = jnp.asarray(exact, jnp.float32).astype(BF16)
    assert s.dtype == h.dtype == BF16 and r.dtype == jnp.float32
    np.testing.assert_array_equal(f64(s), f64(want))
    in_bf16 = u[0]
    for k in range(1, 4):
        in_bf16 = in_bf16 + u[k]                              # bf16 + bf16: rounded to bf16 each time
    rounded_often = (x + in_bf16).astype(BF16)
    assert np.any(f64(rounded_often) != f64(want))
    sd = f64(want)
    np.testing.assert_array_equal(f64(h), f64(jnp.asarray(sd * (1.0 + f64(w)), jnp.float32).astype(BF16)))
    np.testing.assert_allclose(f64(r), 1 / np.sqrt(np.mean(sd * sd, -1, keepdims=True) + 1e-6), rtol=1e-5)


@pytest.mark.parametrize("slices,kernel", [(3, False), (6, False), (4, True), (1, True)])
def test_slice_count_not_a_power_of_two_runs_the_reference(seed, monkeypatch, slices, kernel):
    """The kernel's slice axis is a Triton block dimension, so only a power-of-two slice count (1, 2, 4, ...)
    reaches it: 3 or 6 slices run the reference even when the kernel is asked for, with the reference's
    outputs exactly, while 4 slices, or one, run the kernel, once."""
    assert pallas_triton.supports(64, slices) == kernel
    x, u, w = draws(seed, slices, (2, 3, 64), jnp.float32)
    calls, fn = [], pallas_triton.add_rms_norm
    monkeypatch.setattr(pallas_triton, "add_rms_norm",
                        lambda x, u, *a, **kw: calls.append(u.shape) or fn(x, u, *a, **kw))
    out = api.add_rms_norm(x, u, w, eps=1e-6, offset=1.0, implementation="pallas_interpret")
    want = reference.add_rms_norm(x, u, w, eps=1e-6, offset=1.0)
    assert calls == ([u.shape] if kernel else [])
    for a, b in zip(out, want):
        if kernel:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_supports_widths_up_to_64_chunks():
    """A row is taken in at most 64 chunks, whatever their size: 64 chunks of 512 (32768) and 63 of 1 (63) are
    taken, 65 chunks of 512 (33280) or of 1 (65) are not; a width of 0 is not taken (and raises nothing)."""
    assert [pallas_triton.chunk_of(d) for d in (32768, 33280, 63, 65)] == [512, 512, 1, 1]
    assert [pallas_triton.supports(d) for d in (32768, 33280, 63, 65)] == [True, False, True, False]
    assert pallas_triton.supports(0) is False


def test_bf16_linear_slices_are_fp32(seed):
    """Linear(x, slices=8) on a bf16 layer: 8 slices [8, ..., out] in fp32, each the fp32 product of its 8 rows of
    K, not rounded to bf16 (a bf16 slice is ~1e-3 off); their sum is the product in float64 within fp32 rounding."""
    from flax import nnx

    from jaxspec.model import Linear
    lin = Linear(64, 16, dtype=BF16, rngs=nnx.Rngs(seed % 1000))
    x = jnp.asarray(np.random.default_rng(seed).standard_normal((2, 3, 64)), jnp.float32).astype(BF16)
    with jax.default_matmul_precision("highest"):
        parts = lin(x, slices=8)
    assert parts.shape == (8, 2, 3, 16) and parts.dtype == jnp.float32
    xd, wd = f64(x), f64(lin.kernel[...])
    want = np.stack([xd[..., 8 * k:8 * k + 8] @ wd[8 * k:8 * k + 8] for k in range(8)])
    np.testing.assert_allclose(f64(parts), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    np.testing.assert_allclose(f64(parts).sum(0), xd @ wd, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.fixture(scope="module")
def target(tiny_hf):
    from convert.hf import load_target
    return load_target(tiny_hf[0], dtype="float32")


def forward(target, b, n):
    """The model's forward on a chain of n tokens per sequence for b sequences (fresh tokens): logits."""
    from flax import nnx

    from jaxspec import tree as trees
    from jaxspec.model import init_state
    tokens = jnp.asarray(np.random.default_rng(b * 100 + n).integers(0, 509, (b, n)))
    gd, params = nnx.split(target)
    tr = trees.chain(b, n)
    return jax.jit(lambda p, t, s: nnx.merge(gd, p)(t, s, tr)[0])(params, tokens, init_state(target.cfg, b, n + 8))


def spy(monkeypatch):
    """Records (x, u) shapes of every add_norm (jaxspec.model.add_rms_norm) and of the last layer's add."""
    import jaxspec.model as model
    norms, adds = [], []
    fn, add = model.add_rms_norm, model.add
    monkeypatch.setattr(model, "add_rms_norm",
                        lambda x, u, *a, **kw: norms.append((x.shape, u.shape)) or fn(x, u, *a, **kw))
    monkeypatch.setattr(model, "add", lambda x, u: adds.append((x.shape, u.shape)) or add(x, u))
    return norms, adds


def test_reference_path_gets_whole_updates(target, monkeypatch):
    """Without the kernel (JAXSPEC_ADD_RMS_NORM unset: the reference on this CPU) no product is split: out_slices
    is 0 for any block, and every residual add of a 12-row forward, the last layer's included, takes the whole
    update [B, N, D]."""
    from jaxspec.model import out_slices
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    assert [out_slices(n) for n in (1, 16, 64)] == [0, 0, 0]
    norms, adds = spy(monkeypatch)
    forward(target, 2, 6)
    assert len(norms) == 2 * len(target.layers) - 1 and len(adds) == 1, (norms, adds)
    assert all(u == x for x, u in norms + adds), (norms, adds)


def test_kernel_path_slices_by_rows_of_the_whole_block(target, monkeypatch):
    """With the kernel, a block's products hand over slices by its rows, batch x nodes: 2 sequences of 6 nodes
    (12 rows) give every residual add, the last layer's included, the 8 slices [8, B, N, D]; 2 sequences of 40
    nodes (80 rows, though each sequence has only 40) give whole updates; both with the reference path's logits."""
    for b, n, sliced in ((2, 6, True), (2, 40, False)):
        monkeypatch.delenv(api.ENV_VAR, raising=False)
        ref = forward(target, b, n)
        monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
        norms, adds = spy(monkeypatch)
        got = forward(target, b, n)
        assert len(norms) == 2 * len(target.layers) - 1 and len(adds) == 1, (norms, adds)
        assert all(u == ((8,) + x if sliced else x) for x, u in norms + adds), (b, n, norms, adds)
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5)
        monkeypatch.undo()


def test_one_token_gdn_step_hands_over_slices(target, monkeypatch):
    """The one-token step with the fused GDN decode (JAXSPEC_GDN_DECODE=pallas_interpret) and the kernel: the GDN
    layers' out_proj, like every other product in front of a residual add, hands over its 8 slices (2 rows), and
    the logits are the reference path's."""
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    monkeypatch.delenv("JAXSPEC_GDN_DECODE", raising=False)
    ref = forward(target, 2, 1)
    monkeypatch.setenv("JAXSPEC_GDN_DECODE", "pallas_interpret")
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    norms, adds = spy(monkeypatch)
    got = forward(target, 2, 1)
    assert len(norms) == 2 * len(target.layers) - 1 and len(adds) == 1, (norms, adds)
    assert all(u == (8,) + x for x, u in norms + adds), (norms, adds)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5)
