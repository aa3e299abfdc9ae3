"""The skinny matmul's Mosaic GPU kernel (pallas_kernels/skinny_matmul/pallas_mosaic.py).

CPU: the kernel, in both forms of its product, under Mosaic GPU's interpreter (TMA copies, warpgroup MMA and
barriers simulated) against the reference on fresh random inputs per test, with K slices of several
pipeline steps, ragged row counts and every padding; its tiles and refusals; its lowering at the real projection shapes for
an abstract H200; jaxspec's Linear through it. GPU (`-m gpu`): the compiled kernel at every real shape.
Errors are max |x - ref| / max |ref| against an fp32 reference, bound 1e-2 (bf16 / f16 inputs, issue 6).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from kernel_tests import on_gpu
from pallas_kernels.skinny_matmul import api, arg_specs, pallas_mosaic, reference, tiling

BOUND = 1e-2


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def fp32_reference(x, w):
    with jax.default_matmul_precision("highest"):
        return reference.matmul(x.astype(jnp.float32), w.astype(jnp.float32))


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("m,k,n,tiles", [
    (2, 256, 128, dict(split_k=1)), (16, 512, 384, {}), (17, 256, 192, dict(block_n=64, split_k=2)),
    (64, 384, 128, dict(split_k=1, steps=2)), (65, 512, 256, dict(split_k=2)), (128, 256, 128, dict(split_k=1))])
def test_kernel_matches_reference(seed, m, k, n, tiles, dtype, transposed):
    block_n, block_k, split_k, _ = pallas_mosaic.tiles(m, k, n, **tiles, transposed=transposed)
    assert k // split_k // block_k >= 2 or n // block_n >= 2          # several steps, or several column blocks
    x, w = arg_specs.make_inputs(seed, m, k, n, jnp.dtype(dtype))
    out = pallas_mosaic.matmul(x, w, interpret=True, transposed=transposed, **tiles)
    assert out.shape == (m, n) and out.dtype == x.dtype
    err = rel_err(out, fp32_reference(x, w))
    assert err < BOUND, f"relative error {err:.2e}"


def test_tiles():
    """The default tiles: one wave of one block per SM (session 41), the deepest pipeline up to 6 steps that
    shared memory holds."""
    assert pallas_mosaic.tiles(16, 17408, 5120) == (128, 64, 2, 6)   # down_proj: 40 column blocks x 2 = 80 <= 132
    assert pallas_mosaic.tiles(16, 6144, 5120) == (128, 64, 2, 6)    # out_proj / o_proj
    assert pallas_mosaic.tiles(64, 5120, 14336) == (128, 64, 1, 6)   # attention q|k|v: 112 column blocks
    assert pallas_mosaic.tiles(16, 5120, 34816) == (128, 64, 1, 6)   # MLP gate|up: 272 blocks, no slices
    assert pallas_mosaic.tiles(128, 5120, 1024) == (128, 64, 16, 5)  # 6 steps of 128 rows do not fit
    assert pallas_mosaic.tiles(16, 192, 320) == (64, 64, 1, 6)       # N not a multiple of 128
    assert pallas_mosaic.tiles(16, 17408, 5120, steps=3, transposed=False) == (128, 64, 2, 3)
    assert [pallas_mosaic.padded_rows(m, transposed=False) for m in (2, 64, 65, 128)] == [64, 64, 128, 128]
    assert [pallas_mosaic.padded_rows(m) for m in (2, 16, 17, 65, 128)] == [16, 16, 32, 80, 128]
    for name, (k, n, _) in {**arg_specs.REAL, **arg_specs.FUSED}.items():
        for m in (16, 64, 65, 128):
            for transposed in (False, True):
                if not pallas_mosaic.supports(m, k, n, jnp.bfloat16):
                    assert n % 64, name                                     # only gdn.in_proj's 16480
                    continue
                bn, bk, split, steps = pallas_mosaic.tiles(m, k, n, transposed=transposed)
                assert n % bn == 0 and k % (bk * split) == 0, name
                assert n // bn * split <= tiling.NUM_SMS or split == 1, name   # one wave where slices are used
                assert n // bn * split * 2 > tiling.NUM_SMS or k % (bk * split * 2), name   # and the most slices
                assert pallas_mosaic.smem_bytes(m, bn, bk, steps, transposed=transposed) <= pallas_mosaic.SMEM_BYTES
    with pytest.raises(ValueError, match="shared memory"):
        pallas_mosaic.tiles(128, 5120, 1024, block_n=256, block_k=256, steps=4)
    with pytest.raises(ValueError, match="block_k \\* split_k"):
        pallas_mosaic.tiles(16, 192, 64, split_k=2)


@pytest.mark.parametrize("m,k,n,dtype", [(1, 64, 64, "bfloat16"), (129, 64, 64, "bfloat16"),
                                         (16, 100, 64, "bfloat16"), (16, 64, 96, "float16"),
                                         (16, 64, 64, "float32")])
def test_kernel_refuses_what_it_does_not_take(m, k, n, dtype):
    x, w = arg_specs.make_inputs(0, m, k, n, jnp.dtype(dtype))
    assert not pallas_mosaic.supports(m, k, n, w.dtype)
    with pytest.raises(ValueError, match=f"got x \\({m}, {k}\\) {dtype}, w \\({k}, {n}\\) {dtype}"):
        pallas_mosaic.matmul(x, w, interpret=True)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("rows", [16, 64, 65])
@pytest.mark.parametrize("name", ["mlp.gate_proj", "mlp.down_proj", "attn.k_proj"])
def test_mosaic_lowering(name, rows, transposed):
    """The compiled path's lowering at real shapes, bf16, for an abstract H200 (compiling it needs the GPU):
    one Mosaic GPU kernel."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    k, n, _ = arg_specs.REAL[name]
    args = (jax.ShapeDtypeStruct((rows, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16))
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        fn = jax.jit(functools.partial(pallas_mosaic.matmul, transposed=transposed))
        hlo = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert len(re.findall(r"custom_call @mosaic_gpu", hlo)) == 1


def test_linear_runs_the_mosaic_kernel(seed, monkeypatch):
    """jaxspec's Linear through the op with JAXSPEC_SKINNY_MATMUL=pallas_mosaic: the kernel (counted, here
    interpreted) for bf16 [2, 8, K] rows, XLA's dot for one row and for fp32."""
    from flax import nnx

    from jaxspec.model import Linear
    calls = []
    kernel = pallas_mosaic.matmul
    monkeypatch.setattr(pallas_mosaic, "matmul", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_mosaic")
    for dtype, shape, kernel_rows in ((jnp.bfloat16, (2, 8, 128), [(16, 128)]), (jnp.bfloat16, (1, 1, 128), []),
                                      (jnp.float32, (2, 8, 128), [])):
        lin = Linear(128, 192, dtype=dtype, rngs=nnx.Rngs(seed % 1000))
        calls.clear()
        x = jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)
        with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
            out = lin(x)
        assert calls == kernel_rows
        assert out.shape == shape[:-1] + (192,) and out.dtype == dtype
        assert rel_err(out, fp32_reference(x, lin.kernel[...])) < BOUND


@on_gpu
@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("m", (16, 64, 65))
@pytest.mark.parametrize("name", sorted(arg_specs.REAL))
def test_gpu_kernel_matches_reference(seed, name, m, transposed):
    k, n, _ = arg_specs.REAL[name]
    x, w = arg_specs.make_inputs(seed, m, k, n, jnp.bfloat16)
    out = jax.jit(functools.partial(pallas_mosaic.matmul, transposed=transposed))(x, w)
    err = rel_err(out, jax.jit(fp32_reference)(x, w))
    assert err < BOUND, f"relative error {err:.2e}"
