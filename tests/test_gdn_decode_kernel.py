"""The fused GDN decode step (pallas_kernels/gdn_decode) against its reference and against the model's
general path on a one-node tree.

CPU: the kernel in interpret mode on fresh random inputs per test (several head layouts, fp32 and bf16);
the Triton lowering at the real shape for an abstract H200; the engine's greedy AR through the kernel.
GPU (`-m gpu`): the compiled kernel at the real shape. Errors are max |x - ref| / max |ref|: bound 1e-4 in
fp32, 1e-2 in bf16 (issue 6).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_tests import check_dispatch, on_gpu
from pallas_kernels.gdn_decode import api, pallas_triton, reference
from pallas_kernels.gdn_decode.arg_specs import REAL, make_inputs, shapes

NAMES = ("out", "k", "delta", "G")


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def assert_matches(out, ref, bound):
    for name, x, r in zip(NAMES, out, ref):
        assert x.shape == r.shape and x.dtype == r.dtype, (name, x.shape, r.shape, x.dtype, r.dtype)
        assert np.isfinite(np.asarray(x, np.float32)).all(), name
        err = rel_err(x, r)
        assert err < bound, f"{name}: relative error {err:.2e} >= {bound:.0e}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("b,hk,rep,dk,dv,kw", [(1, 2, 3, 16, 32, 4), (3, 4, 1, 32, 16, 4), (2, 1, 2, 64, 64, 3)])
def test_kernel_matches_reference(seed, b, hk, rep, dk, dv, kw, dtype):
    args = make_inputs(seed, b, hk, rep, dk, dv, kw, jnp.dtype(dtype))
    out = pallas_triton.gdn_decode(*args, eps=1e-6, interpret=True)
    ref = reference.gdn_decode(*args, eps=1e-6)
    assert_matches(out, ref, 1e-4 if dtype == "float32" else 1e-2)


@pytest.mark.parametrize("b,hk,rep,dk,dv,kw", [(1, 2, 3, 16, 32, 4), (3, 4, 1, 32, 16, 4), (2, 1, 2, 64, 64, 3)])
def test_kernel_rounds_like_the_model_in_bf16(seed, b, hk, rep, dk, dv, kw):
    """In bf16 the kernel rounds the attention output to bf16 before the gated norm, as the model does: in
    interpret mode its output is the reference's to well under one bf16 step (the 1e-2 bound of the test above
    would pass a kernel that skips that rounding: 1e-3 to 6e-3 off)."""
    args = make_inputs(seed, b, hk, rep, dk, dv, kw, jnp.dtype("bfloat16"))
    out = pallas_triton.gdn_decode(*args, eps=1e-6, interpret=True)[0]
    err = rel_err(out, reference.gdn_decode(*args, eps=1e-6)[0])
    assert err < 5e-4, f"out: relative error {err:.2e}"


def test_bad_layouts_are_refused(seed):
    args = list(make_inputs(seed, 1, 2, 3, 16, 32, 4))
    args[0] = args[0][:, :-1]
    with pytest.raises(ValueError, match="conv channels"):
        reference.gdn_decode(*args, eps=1e-6)
    args = make_inputs(seed, 1, 2, 3, 16, 24, 4)
    with pytest.raises(ValueError, match="power-of-two"):
        pallas_triton.gdn_decode(*args, eps=1e-6, interpret=True)


def test_dispatch(monkeypatch):
    check_dispatch(api, monkeypatch, gpu_default="pallas_triton")   # the AR loop converts into one CUDA graph with it


# Arguments that break the contract, each against conv_in [B, C], z [B, Hv, Dv] and s0 [B, Hv, Dk, Dv] (here B = 2,
# Hk = 2, rep = 2, Dk = Dv = 16, a conv of K = 4 taps): (argument, its index, the wrong value). The kernel computed NaN
# or garbage from most of them, the reference failed deep in an einsum or broadcast some.
BAD_ARGS = [("history", 1, lambda x: x[:, :2]), ("history", 1, lambda x: x[:1]), ("conv_w", 2, lambda x: x[:, :64]),
            ("z", 3, lambda x: x[:1]), ("a", 4, lambda x: x[:, :2]), ("b", 5, lambda x: x[:1]),
            ("A_log", 6, lambda x: x[:2]), ("dt_bias", 7, lambda x: x[None]), ("norm_w", 8, lambda x: x[:8]),
            ("norm_w", 8, lambda x: jnp.concatenate([x, x])), ("s0", 9, lambda x: x[:1]), ("s0", 9, lambda x: x[:, :2]),
            ("s0", 9, lambda x: x[..., :8])]


@pytest.mark.parametrize("name,index,bad", BAD_ARGS, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(BAD_ARGS)])
def test_bad_shapes_are_refused(seed, name, index, bad):
    """Both implementations refuse an argument that does not fit the others, naming it, its shape and the one
    expected."""
    args = list(make_inputs(seed, 2, 2, 2, 16, 16, 4))
    args[index] = bad(args[index])
    shape = re.escape(str(args[index].shape))
    for impl in ("reference", "pallas_interpret"):
        with pytest.raises(ValueError, match=rf"gdn_decode: {name} {shape}.* must be"):
            api.gdn_decode(*args, eps=1e-6, implementation=impl)


def test_gpu_default_falls_back_for_head_dims_the_kernel_does_not_take(seed, monkeypatch):
    """On a GPU, head dims that are not powers of two run the reference unless the kernel is asked for by name
    (then refused by it), as gdn_tree_inputs and tree_attention do."""
    args = make_inputs(seed, 1, 2, 2, 24, 24, 4)
    ref = reference.gdn_decode(*args, eps=1e-6)
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert_matches(api.gdn_decode(*args, eps=1e-6), ref, 1e-6)
    assert api.resolve(dk=24, dv=24) == api.resolve(dk=16, dv=24) == "reference"
    assert api.resolve() == api.resolve(dk=16, dv=32) == "pallas_triton"
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    assert api.resolve(dk=24, dv=24) == "reference" and api.resolve(dk=16, dv=16) == "pallas_interpret"
    assert api.resolve("pallas_triton", dk=24, dv=24) == "pallas_triton"
    with pytest.raises(ValueError, match="power-of-two head dims, got Dk=24, Dv=24"):
        api.gdn_decode(*args, eps=1e-6, implementation="pallas_interpret")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_empty_batch(seed, dtype):
    """No sequence: every implementation returns the reference's empty outputs (the kernel's grid failed on it)."""
    args = make_inputs(seed, 0, 2, 2, 16, 16, 4, jnp.dtype(dtype))
    ref = reference.gdn_decode(*args, eps=1e-6)
    assert ref[0].shape == (0, 4, 16)
    for impl in ("pallas_interpret", "pallas_triton"):
        out = api.gdn_decode(*args, eps=1e-6, implementation=impl)
        assert [(x.shape, x.dtype) for x in out] == [(x.shape, x.dtype) for x in ref], impl


def _layer_and_inputs(target, seed, b=2):
    layer = next(l.linear_attn for l in target.layers if not l.is_full)
    cfg = target.cfg
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((b, 1, cfg.hidden_size)), jnp.float32)
    history = jnp.asarray(rng.standard_normal((b, cfg.conv_kernel - 1, cfg.conv_dim)), jnp.float32)
    s0 = jnp.asarray(rng.standard_normal((b, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                          cfg.linear_value_head_dim)) * 0.1, jnp.float32)
    return layer, x, history, s0


@pytest.fixture(scope="module")
def target(tiny_hf):
    from convert.hf import load_target
    return load_target(tiny_hf[0], dtype="float32")


@pytest.mark.parametrize("implementation", ["reference", "pallas_interpret"])
def test_decode_is_the_models_one_token_step(target, seed, monkeypatch, implementation):
    """GatedDeltaNet.decode (the fused op) gives what the general tree path gives for one node: the
    layer's output and everything commit reads (conv_in, k, Delta, G)."""
    from jaxspec import tree as trees
    layer, x, history, s0 = _layer_and_inputs(target, seed)
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    ref_out, ref_p = layer(x, history, s0, trees.chain(x.shape[0], 1))
    monkeypatch.setenv(api.ENV_VAR, implementation)
    # decode() called directly: the layer's own dispatch sends "reference" down the general path, which would
    # compare that path with itself
    out, p = layer.decode(x, history, s0)
    assert rel_err(out, ref_out) < 1e-5
    for name in ("conv_in", "k", "delta", "G", "s_mid"):
        a, r = getattr(p, name), getattr(ref_p, name)
        assert a.shape == r.shape, (name, a.shape, r.shape)
        if r.size:
            assert rel_err(a, r) < 1e-5, name


def test_engine_through_the_kernel_stays_lossless(target, monkeypatch):
    """Greedy AR with the kernel (interpret mode) in every GDN layer's one-token step: the same tokens as
    without, so the pending it hands to commit is right too; the kernel is traced, not silently skipped."""
    from jaxspec.engine import Engine
    rs = np.random.RandomState(11)
    prompts = [rs.randint(0, 512, size=n).tolist() for n in (5, 18)]
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    ar = Engine(target).generate(prompts, 16).tokens
    calls = []
    kernel = pallas_triton.gdn_decode
    monkeypatch.setattr(pallas_triton, "gdn_decode", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    assert Engine(target).generate(prompts, 16).tokens == ar
    assert len(calls) == len(target.cfg.linear_layers), calls       # once per GDN layer in the traced round


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_triton_lowering(dtype):
    """The compiled path's lowering to Triton IR at the real shape for an abstract H200 (compiling it
    needs the GPU): one kernel."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    args = shapes(1, **REAL, dtype=dtype)
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda *a: pallas_triton.gdn_decode(*a, eps=1e-6))
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1


@on_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("b", [1, 3])
def test_gpu_kernel_matches_reference(seed, b, dtype):
    args = make_inputs(seed, b, **REAL, dtype=jnp.dtype(dtype))
    out = jax.jit(lambda *a: pallas_triton.gdn_decode(*a, eps=1e-6))(*args)
    with jax.default_matmul_precision("highest"):
        ref = jax.jit(lambda *a: reference.gdn_decode(*a, eps=1e-6))(*args)
    assert_matches(out, ref, 1e-4 if dtype == "float32" else 1e-2)


def test_bench_runs_and_writes_json(tmp_path):
    """The benchmark at the real shape (on the CPU: the reference only, 2 layers, 1 timed call)."""
    import json

    from pallas_kernels.gdn_decode import bench
    bench.main(["--layers", "2", "--iters", "1", "--json", str(tmp_path / "b.json")])
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [r["impl"] for r in rows] == ["reference"] and rows[0]["us_per_layer"] > 0
    assert 0 < rows[0]["device_us_per_layer"] < float("inf")                  # from a trace of the loop
    assert rows[0]["bytes_per_layer"] > 48 * 128 * 128 * 4                     # at least the state


def test_zero_head_dims_are_refused(seed):
    """Dk = 0 divided by zero in the key-head count; Dv = 0 has no value channels: a ValueError names both."""
    args = list(make_inputs(seed, 1, 2, 2, 16, 16, 4, jnp.float32))
    args[-1] = args[-1][:, :, :0]                       # s0 [B, Hv, 0, Dv]
    with pytest.raises(ValueError, match=r"gdn_decode: z \(1, 4, 16\) and s0 \(1, 4, 0, 16\) need value heads, Dv and "
                                         r"Dk > 0"):
        api.gdn_decode(*args, eps=1e-6, implementation="reference")
