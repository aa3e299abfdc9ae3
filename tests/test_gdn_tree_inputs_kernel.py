"""The GDN tree inputs (pallas_kernels/gdn_tree_inputs: conv along the tree, silu, l2 norms, gates) against
their reference, and the reference against a float64 numpy walk of the tree written here.

CPU: the kernel in interpret mode on fresh random inputs per test (chains and random trees, N from 1 to 128,
grouped heads, a conv of 3 taps, bf16 inputs); the Triton lowering for an abstract H200 at the real shape.
GPU (`-m gpu`, on the H200): the compiled kernel at the real shape.

Errors are max |x - ref| / max |ref| per output. Kernel and reference compute in fp32 from the same inputs (the
one-hot selections of the conv are exact), so the bound is 1e-5 (issue 6 asks < 1e-4 for fp32, < 1e-2 for bf16
inputs).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_tests import on_gpu
from pallas_kernels.gdn_tree_inputs import api, pallas_triton, reference
from pallas_kernels.gdn_tree_inputs.arg_specs import REAL, make_inputs, random_parents

BOUND = 1e-5
NAMES = ("q", "k", "v", "g", "beta")


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def assert_matches(out, ref, bound=BOUND):
    for name, x, r in zip(NAMES, out, ref):
        assert x.shape == r.shape and x.dtype == jnp.float32, (name, x.shape, r.shape, x.dtype)
        assert np.isfinite(np.asarray(x)).all(), name
        err = rel_err(x, r)
        assert err < bound, f"{name}: relative error {err:.2e} >= {bound:.0e}"


def numpy_oracle(args, parent, dk, dv):
    """Float64, node by node: walk each node's parents for its conv window (history rows past the root),
    then silu, l2 norms and gates, from the grouped in_proj layout [conv (q, k, v...), z, b, a] per key head."""
    y, history, conv_w, a_log, dt_bias, _ = (np.asarray(x, np.float64) for x in args)
    b, n, w = y.shape
    kw, c = conv_w.shape
    hv = a_log.shape[0]
    hk = (c - hv * dv) // (2 * dk)
    rep, gc, gw = hv // hk, c // hk, w // hk
    grouped = y.reshape(b, n, hk, gw)
    conv_in = grouped[..., :gc].reshape(b, n, c)
    x = np.zeros((b, n, c))
    for bi in range(b):
        for i in range(n):
            path = [i]
            while parent[bi, path[-1]] >= 0 and len(path) < kw:
                path.append(parent[bi, path[-1]])
            window = [conv_in[bi, j] for j in path]                      # itself, parent, grandparent, ...
            window += [history[bi, kw - 1 - t] for t in range(1, kw - len(path) + 1)]   # newest history first
            x[bi, i] = sum(conv_w[kw - 1 - d] * window[d] for d in range(kw))
    x = (x / (1 + np.exp(-x))).reshape(b, n, hk, gc)
    l2 = lambda t: t / np.sqrt(np.sum(t * t, -1, keepdims=True) + 1e-6)
    q, k = l2(x[..., :dk]) / np.sqrt(dk), l2(x[..., dk:2 * dk])
    v = x[..., 2 * dk:].reshape(b, n, hv, dv)
    gates = grouped[..., gc + rep * dv:]
    beta_in, a = gates[..., :rep].reshape(b, n, hv), gates[..., rep:].reshape(b, n, hv)
    g = -np.exp(a_log) * np.log1p(np.exp(a + dt_bias))
    return q, k, v, g, 1 / (1 + np.exp(-beta_in))


# ---------------------------------------------------------------------------------------------- CPU

HEADS = [dict(hk=2, rep=3, dk=16, dv=32, kw=4), dict(hk=1, rep=2, dk=32, dv=16, kw=4),
         dict(hk=2, rep=1, dk=16, dv=16, kw=3)]


@pytest.mark.parametrize("chain", [True, False], ids=["chain", "tree"])
@pytest.mark.parametrize("n", [1, 5, 16, 17, 64])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: "hk{hk}-rep{rep}-dk{dk}-dv{dv}-kw{kw}".format(**h))
def test_reference_is_the_tree_walk(seed, n, chain, heads):
    parent = random_parents(seed, 2, n, chain)
    args = make_inputs(seed, parent, **heads)
    out = reference.gdn_tree_inputs(*args, dk=heads["dk"], dv=heads["dv"])
    assert_matches(out, numpy_oracle(args, parent, heads["dk"], heads["dv"]))


@pytest.mark.parametrize("chain", [True, False], ids=["chain", "tree"])
@pytest.mark.parametrize("n", [1, 5, 16, 17, 64, 128])
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: "hk{hk}-rep{rep}-dk{dk}-dv{dv}-kw{kw}".format(**h))
def test_kernel_matches_reference(seed, n, chain, heads):
    parent = random_parents(seed, 2, n, chain)
    args = make_inputs(seed, parent, **heads)
    dims = dict(dk=heads["dk"], dv=heads["dv"])
    out = pallas_triton.gdn_tree_inputs(*args, **dims, interpret=True)
    assert_matches(out, reference.gdn_tree_inputs(*args, **dims))


def test_kernel_bf16_inputs(seed):
    """The model's dtype: bf16 in_proj product, history and taps; both compute in fp32 from them."""
    parent = random_parents(seed, 3, 20, chain=False)
    args = make_inputs(seed, parent, hk=2, rep=3, dk=16, dv=16, kw=4, dtype=jnp.bfloat16)
    out = pallas_triton.gdn_tree_inputs(*args, dk=16, dv=16, interpret=True)
    assert_matches(out, reference.gdn_tree_inputs(*args, dk=16, dv=16))


@pytest.mark.parametrize("history_dtype", [jnp.bfloat16, jnp.float32])
def test_reference_in_bf16_equals_it_in_fp32(seed, history_dtype):
    """The reference joins history and nodes in their own dtype (bf16: half the bytes) and casts each window after:
    bit for bit the outputs of the same values given in fp32, and of a history in another dtype than the nodes'."""
    parent = random_parents(seed, 2, 24, chain=False)
    y, history, *rest = make_inputs(seed, parent, hk=2, rep=3, dk=16, dv=16, kw=4, dtype=jnp.bfloat16)
    fn = jax.jit(reference.gdn_tree_inputs, static_argnames=("dk", "dv"))     # as the model runs it
    out = fn(y, history.astype(history_dtype), *rest, dk=16, dv=16)
    wide = fn(y.astype(jnp.float32), history.astype(jnp.float32), *rest, dk=16, dv=16)
    for name, x, r in zip(NAMES, out, wide):
        assert x.dtype == jnp.float32 and np.array_equal(np.asarray(x), np.asarray(r)), name


def test_refusals_and_fallbacks(seed, monkeypatch):
    """Shapes the kernel cannot take are refused by it, naming them, and left to the reference by the api;
    an in_proj width that does not match the heads is refused by both."""
    parent = random_parents(seed, 1, 6, chain=True)
    small = make_inputs(seed, parent, hk=2, rep=3, dk=8, dv=16, kw=4)
    with pytest.raises(ValueError, match="Dk=8"):
        pallas_triton.gdn_tree_inputs(*small, dk=8, dv=16, interpret=True)
    monkeypatch.setenv(api.ENV_VAR, "pallas_triton")
    assert api.resolve(6, 8, 16) == "reference" and api.resolve(129, 16, 16) == "reference"
    assert api.resolve(6, 16, 16) == "pallas_triton"
    assert_matches(api.gdn_tree_inputs(*small, dk=8, dv=16), reference.gdn_tree_inputs(*small, dk=8, dv=16))
    monkeypatch.setenv(api.ENV_VAR, "pallas_mosaic")
    with pytest.raises(ValueError, match="JAXSPEC_GDN_TREE_INPUTS='pallas_mosaic'"):
        api.resolve(6, 16, 16)
    monkeypatch.delenv(api.ENV_VAR)
    assert api.resolve(16, 128, 128) == "reference"          # this test runs on the CPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert [api.resolve(n, 128, 128) for n in (1, 2, 16, 64, 65, 129)] == ["reference"] + ["pallas_triton"] * 3 + [
        "reference"] * 2                                      # the GPU default: blocks of 2..64 nodes
    assert api.resolve(16, 8, 16) == "reference"             # a shape the kernel does not take
    monkeypatch.setenv(api.ENV_VAR, "reference")
    assert api.resolve(16, 128, 128) == "reference" and api.resolve(16, 128, 128, "pallas_triton") == "pallas_triton"
    monkeypatch.undo()
    y, *rest = make_inputs(seed, parent, hk=2, rep=3, dk=16, dv=16, kw=4)
    for fn in (reference.gdn_tree_inputs, pallas_triton.gdn_tree_inputs):
        with pytest.raises(ValueError, match="in_proj width 267 "):
            fn(y[..., :-1], *rest, dk=16, dv=16)


# Arguments that break the contract, each against y [B, N, W], conv_w [K, C] and A_log [Hv] (here B = 2, N = 5,
# Hk = 2, rep = 2, Dk = Dv = 16, K = 4): (argument, its index, the wrong value). The kernel computed NaN or garbage
# from most of them (a float `rows` it cast), the reference failed deep in a gather or a broadcast.
BAD_ARGS = [("history", 1, lambda x: x[:, :2]), ("history", 1, lambda x: x[:1]), ("dt_bias", 4, lambda x: x[:2]),
            ("rows", 5, lambda x: x[:, :3]), ("rows", 5, lambda x: x[:, :, :4]), ("rows", 5, lambda x: x[:1]),
            ("rows", 5, lambda x: x.astype(jnp.float32))]


@pytest.mark.parametrize("name,index,bad", BAD_ARGS, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(BAD_ARGS)])
def test_bad_shapes_are_refused(seed, name, index, bad):
    """Both implementations refuse an argument that does not fit the others, naming it, its shape and the one
    expected."""
    args = list(make_inputs(seed, random_parents(seed, 2, 5), hk=2, rep=2, dk=16, dv=16, kw=4))
    args[index] = bad(args[index])
    shape = re.escape(str(args[index].shape))
    for impl in ("reference", "pallas_interpret"):
        with pytest.raises(ValueError, match=rf"gdn_tree_inputs: {name} {shape}.* must be"):
            api.gdn_tree_inputs(*args, dk=16, dv=16, implementation=impl)


@pytest.mark.parametrize("empty", ["batch", "nodes"])
def test_empty_blocks(seed, empty):
    """No sequence or no node: every implementation returns the reference's empty outputs (the kernel's grid
    failed on the first, it refused the second)."""
    y, history, conv_w, a_log, dt_bias, rows = make_inputs(seed, random_parents(seed, 2, 5), hk=2, rep=2, dk=16,
                                                           dv=16, kw=4)
    if empty == "batch":
        args = (y[:0], history[:0], conv_w, a_log, dt_bias, rows[:0])
    else:
        args = (y[:, :0], history, conv_w, a_log, dt_bias, rows[:, :, :0])
    ref = reference.gdn_tree_inputs(*args, dk=16, dv=16)
    assert ref[2].shape == ((0, 5, 4, 16) if empty == "batch" else (2, 0, 4, 16))
    for impl in ("pallas_interpret", "pallas_triton"):
        out = api.gdn_tree_inputs(*args, dk=16, dv=16, implementation=impl)
        assert [(x.shape, x.dtype) for x in out] == [(x.shape, x.dtype) for x in ref], impl


@pytest.mark.parametrize("n", [16, 64, 65])
def test_triton_lowering(n):
    """The compiled path's lowering to Triton IR for an abstract H200 at the real shape (bf16 in_proj product):
    one kernel, power-of-two loads, the scalar gate columns. (Compiling it needs the GPU.)"""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    hk, rep, dk, dv, kw = (REAL[x] for x in ("hk", "rep", "dk", "dv", "kw"))
    hv, c = hk * rep, hk * (2 * dk + rep * dv)
    S = jax.ShapeDtypeStruct
    shapes = (S((1, n, c + hv * dv + 2 * hv), jnp.bfloat16), S((1, kw - 1, c), jnp.bfloat16),
              S((kw, c), jnp.bfloat16), S((hv,), jnp.float32), S((hv,), jnp.float32), S((1, kw, n), jnp.int32))
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda *a: pallas_triton.gdn_tree_inputs(*a, dk=dk, dv=dv))
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1


# ---------------------------------------------------------------------------------------------- GPU


@on_gpu
@pytest.mark.parametrize("chain", [True, False], ids=["chain", "tree"])
@pytest.mark.parametrize("n", [16, 64, 65])
def test_gpu_kernel_matches_reference(seed, n, chain):
    parent = random_parents(seed, 2, n, chain)
    args = make_inputs(seed, parent, **REAL, dtype=jnp.bfloat16)
    dims = dict(dk=REAL["dk"], dv=REAL["dv"])
    out = jax.jit(lambda *a: pallas_triton.gdn_tree_inputs(*a, **dims))(*args)
    assert_matches(out, jax.jit(lambda *a: reference.gdn_tree_inputs(*a, **dims))(*args))


def test_bench_runs_and_writes_json(tmp_path):
    """The benchmark at the real shape (on the CPU: the reference alone, 2 layers, 1 timed call)."""
    import json

    from pallas_kernels.gdn_tree_inputs import bench
    bench.main(["--sizes", "5", "--layers", "2", "--iters", "1", "--json", str(tmp_path / "b.json")])
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [(r["n"], r["impl"]) for r in rows] == [(5, "reference")]
    assert rows[0]["rel_err_vs_reference"] == 0 and rows[0]["device_us_per_layer"] > 0
    hv, c = 48, 16 * (2 * 128 + 3 * 128)
    ins = 5 * (c + hv * 128 + 2 * hv) * 2 + 3 * c * 2 + 4 * c * 2 + 2 * hv * 4 + 4 * 5 * 4   # bf16 y, history, taps
    outs = 5 * (2 * 16 * 128 + hv * 128 + 2 * hv) * 4                                        # fp32 q, k, v, g, beta
    assert rows[0]["bytes_per_layer"] == ins + outs
