"""The skinny matmul (pallas_kernels/skinny_matmul): y = x @ w for the 2..128 rows of a verify.

CPU: the kernel in interpret mode against its reference on fresh random inputs per test (row counts
that are not powers of two, K and N not multiples of the default tiles, every K split), fp32 and
bf16; its refusals; the dispatch; the Triton lowering of the real MLP products for an abstract H200;
jaxspec's Linear through it. The engine with it on is in test_kernels_engine.py. GPU (`-m gpu`): the
compiled kernel at every real projection shape. Errors are max |x - ref| / max |ref|: bound 1e-4 in
fp32, 1e-2 in bf16 (issue 6).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_tests import check_dispatch, on_gpu
from pallas_kernels.skinny_matmul import api, arg_specs, pallas_mosaic, pallas_triton, reference

BOUND = {"float32": 1e-4, "bfloat16": 1e-2}


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def check(out, ref, dtype):
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype, ref.dtype)
    assert np.isfinite(np.asarray(out, np.float32)).all()
    err = rel_err(out, ref)
    assert err < BOUND[dtype], f"relative error {err:.2e} >= {BOUND[dtype]:.0e}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("m,k,n,tiles", [
    (2, 64, 64, {}), (5, 192, 320, {}), (16, 512, 384, {}), (17, 256, 128, dict(split_k=4, block_k=64)),
    (65, 384, 192, dict(block_n=64)), (128, 128, 256, dict(split_k=1)), (33, 640, 64, dict(block_k=64, split_k=2))])
def test_kernel_matches_reference(seed, m, k, n, tiles, dtype):
    x, w = arg_specs.make_inputs(seed, m, k, n, jnp.dtype(dtype))
    out = pallas_triton.matmul(x, w, interpret=True, **tiles)
    with jax.default_matmul_precision("highest"):
        ref = reference.matmul(x.astype(jnp.float32), w.astype(jnp.float32)).astype(x.dtype)
    check(out, ref, dtype)


def test_tiles():
    assert pallas_triton.tiles(65, 17408, 5120) == (128, 128, 8)      # down_proj: 40 column blocks x 8
    assert pallas_triton.tiles(16, 5120, 17408) == (128, 128, 2)      # gate/up: 136 x 2
    assert pallas_triton.tiles(16, 192, 320) == (64, 64, 1)           # N, K not multiples of 128
    # fp32 at 65 rows (padded to 128): 128-deep tiles x 3 stages would need 384 KiB of shared memory
    assert pallas_triton.tiles(65, 5120, 1024, itemsize=4)[:2] == (128, 64)
    assert pallas_triton.tiles(65, 5120, 1024, itemsize=2)[:2] == (128, 128)
    with pytest.raises(ValueError, match="shared memory"):
        pallas_triton.tiles(65, 5120, 1024, block_k=256, itemsize=2, num_stages=4)
    for name, (k, n, _) in arg_specs.REAL.items():
        bn, bk, split = pallas_triton.tiles(65, k, n)
        assert n % bn == 0 and k % (bk * split) == 0, name
    with pytest.raises(ValueError, match="block_k \\* split_k"):
        pallas_triton.tiles(16, 192, 64, split_k=2)


@pytest.mark.parametrize("m,k,n", [(1, 64, 64), (129, 64, 64), (16, 100, 64), (16, 64, 96)])
def test_kernel_refuses_what_it_does_not_take(m, k, n):
    x, w = arg_specs.make_inputs(0, m, k, n)
    assert not pallas_triton.supports(m, k, n)
    with pytest.raises(ValueError, match=f"got x \\({m}, {k}\\), w \\({k}, {n}\\)"):
        pallas_triton.matmul(x, w, interpret=True)


def test_dispatch(monkeypatch):
    check_dispatch(api, monkeypatch)                   # opt-in: slower than XLA's dot inside the model (session 41)


def test_where_the_kernel_applies():
    assert api.applies((2, 8, 64), (64, 128)) and api.applies((65, 5120), (5120, 17408))
    assert not api.applies((1, 1, 5120), (5120, 17408))      # the decode step keeps XLA's dot
    assert not api.applies((1, 8192, 5120), (5120, 17408))   # so does the prefill
    assert not api.applies((16, 5120), (5120, 48))           # in_proj_a / _b
    assert not api.applies((16, 64), (64, 128), same_dtype=False)


def test_mixed_dtypes_keep_xlas_promotion(monkeypatch):
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    x, w = arg_specs.make_inputs(0, 16, 64, 128)
    out = api.matmul(x, w.astype(jnp.bfloat16))
    ref = reference.matmul(x, w.astype(jnp.bfloat16))
    assert out.dtype == ref.dtype == jnp.float32 and rel_err(out, ref) == 0


@pytest.mark.parametrize("impl", ["reference", "pallas_interpret", "pallas_mosaic"])
@pytest.mark.parametrize("x_shape,w_shape", [((4, 128), (64, 64)), ((2, 4, 64), (128, 64)), ((2, 128), (64, 128)),
                                             ((4, 128), (1, 128, 64)), ((4, 128), (128,)), ((), (128, 64))])
def test_api_refuses_shapes_that_do_not_multiply(x_shape, w_shape, impl):
    """x [..., K] @ w [K, N] is checked before the kernels' `applies` (a K mismatch reached the kernel's reshape,
    a 3-d w `supports`), naming both shapes, on every path."""
    with pytest.raises(ValueError, match=r"^skinny matmul: x \(.*\) @ w \(.*\) needs"):
        api.matmul(jnp.ones(x_shape), jnp.ones(w_shape), implementation=impl)


def test_no_kernel_under_a_multi_device_mesh():
    from jax.sharding import AbstractMesh, use_abstract_mesh
    with use_abstract_mesh(AbstractMesh((1, 2), ("data", "model"))):
        assert not api.applies((16, 64), (64, 128))
    with use_abstract_mesh(AbstractMesh((1, 1), ("data", "model"))):
        assert api.applies((16, 64), (64, 128))


def test_linear_runs_the_kernel_where_it_applies(seed, monkeypatch):
    """jaxspec's Linear goes through the op: the kernel (counted) for [2, 8, K] rows, XLA's dot for one row;
    both give the reference's result."""
    from flax import nnx

    from jaxspec.model import Linear
    lin = Linear(128, 192, dtype=jnp.float32, rngs=nnx.Rngs(seed % 1000))
    calls = []
    kernel = pallas_triton.matmul
    monkeypatch.setattr(pallas_triton, "matmul", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    for shape, kernel_rows in (((2, 8, 128), [(16, 128)]), ((1, 1, 128), [])):
        calls.clear()
        x = jnp.asarray(np.random.default_rng(seed).standard_normal(shape), jnp.float32)
        out = lin(x)
        assert calls == kernel_rows
        with jax.default_matmul_precision("highest"):
            ref = reference.matmul(x, lin.kernel[...])
        assert out.shape == ref.shape and rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("rows", arg_specs.ROWS)
@pytest.mark.parametrize("name", ["mlp.gate_proj", "mlp.down_proj"])
def test_triton_lowering(name, rows):
    """The compiled path's lowering to Triton IR at real MLP shapes, bf16, for an abstract H200 (compiling
    it needs the GPU): one kernel."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    k, n, _ = arg_specs.REAL[name]
    args = (jax.ShapeDtypeStruct((rows, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16))
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(pallas_triton.matmul)
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1


@on_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("m", arg_specs.ROWS)
@pytest.mark.parametrize("name", sorted(arg_specs.REAL))
def test_gpu_kernel_matches_reference(seed, name, m, dtype):
    k, n, _ = arg_specs.REAL[name]
    x, w = arg_specs.make_inputs(seed, m, k, n, jnp.dtype(dtype))
    out = jax.jit(pallas_triton.matmul)(x, w)
    with jax.default_matmul_precision("highest"):
        ref = jax.jit(reference.matmul)(x.astype(jnp.float32), w.astype(jnp.float32)).astype(x.dtype)
    check(out, ref, dtype)


def test_bench_runs_and_writes_json(tmp_path):
    """The benchmark at a real shape (on the CPU: XLA only, 2 products, 1 timed call), and its sweep's
    variants all valid tilings of every real shape."""
    import json

    from pallas_kernels.skinny_matmul import bench
    bench.main(["--shapes", "attn.k_proj", "--rows", "16", "--layers", "2", "--iters", "1",
                "--json", str(tmp_path / "b.json")])
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [(r["shape"], r["m"], r["impl"]) for r in rows] == [("attn.k_proj", 16, "xla")]
    assert 0 < rows[0]["device_us"] < float("inf") and rows[0]["tb_s"] > 0 and rows[0]["rel_err_vs_xla"] == 0
    for name, (k, n, _) in arg_specs.REAL.items():
        variants = bench.implementations(65, k, n, sweep=True, on_gpu=True)
        assert len(variants) > 10, name
        assert any(name.startswith("pallas_mosaic/") for name in variants), name
        for v in variants.values():
            kw = getattr(v, "keywords", {})
            if kw and v.func is pallas_triton.matmul:
                bn, bk, split = pallas_triton.tiles(65, k, n, kw["block_n"], kw["block_k"], kw["split_k"])
                assert n % bn == 0 and k % (bk * split) == 0
            elif kw:
                assert v.func is pallas_mosaic.matmul
                bn, bk, split, _ = pallas_mosaic.tiles(65, k, n, kw.get("block_n"), None, kw.get("split_k"),
                                                       kw.get("steps"), kw.get("transposed", True))
                assert n % bn == 0 and k % (bk * split) == 0
    with pytest.raises(SystemExit):
        bench.main(["--shapes", "mlp.gate"])


def test_bench_error_is_against_xla_and_impls_are_checked(tmp_path, monkeypatch):
    """`--impls pallas_mosaic` without xla: the error column still compares with XLA's dot (computed untimed), not
    with the first implementation that ran (here a wrong "kernel", 2x the product: error 1, not 0); an
    `--impls` prefix that names no implementation is refused, not silently run as nothing."""
    import json

    from pallas_kernels.skinny_matmul import bench
    wrong = lambda x, w: 2 * reference.matmul(x, w)
    monkeypatch.setattr(bench, "implementations", lambda m, k, n, sweep, on_gpu, wave=False:
                        {"xla": reference.matmul, "pallas_mosaic": wrong})
    args = ["--shapes", "attn.k_proj", "--rows", "16", "--layers", "1", "--iters", "1"]
    bench.main(args + ["--impls", "pallas_mosaic", "--json", str(tmp_path / "b.json")])
    (row,) = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert row["impl"] == "pallas_mosaic" and row["rel_err_vs_xla"] == pytest.approx(1.0, rel=1e-2)
    with pytest.raises(SystemExit):
        bench.main(args + ["--impls", "pallas_mosiac"])
