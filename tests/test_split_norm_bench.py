"""bench/next/k_split_norm.py, the micro-benchmark of a residual add + RMSNorm that takes a product's K slices: its
Pallas kernel (interpret mode) against the jnp math on random inputs, its forms agreeing with the model's norm,
and its command line at small widths."""

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.add_rms_norm import reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def ksn(monkeypatch):
    spec = importlib.util.spec_from_file_location("k_split_norm", os.path.join(ROOT, "bench/next/k_split_norm.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "CHUNK", 128)
    return mod


@pytest.mark.parametrize("rows, splits, d", [(3, 8, 256), (16, 2, 384)])
def test_kernel_matches_the_jnp_math(ksn, rows, splits, d):
    k = jax.random.split(jax.random.key(rows * splits), 3)
    x = jax.random.normal(k[0], (rows, d), jnp.float32).astype(jnp.bfloat16)
    p = jax.random.normal(k[1], (splits, rows, d), jnp.float32)
    w = (jax.random.normal(k[2], (d,), jnp.float32) * 0.1).astype(jnp.bfloat16)
    s, h, q = ksn.pallas_add_norm(x, p, w, interpret=True)
    assert s.dtype == h.dtype == jnp.bfloat16 and q.shape == (rows, d // 128) and q.dtype == jnp.float32
    want = (x.astype(jnp.float32) + p.sum(0))
    # s is the f32 sum rounded once to bf16: within half a bf16 step of the exact sum (the slices' order may differ)
    np.testing.assert_allclose(np.asarray(s, np.float32), np.asarray(want), rtol=2 ** -8, atol=1e-6)
    sf = np.asarray(s, np.float64)
    np.testing.assert_allclose(np.asarray(h, np.float32), sf * (1.0 + np.asarray(w, np.float64)), rtol=2 ** -8)
    np.testing.assert_allclose(np.asarray(q), (sf * sf).reshape(rows, -1, 128).sum(-1), rtol=1e-5)
    # the row scale from q is the model's deferred norm's
    _, _, r = reference.add_rms_norm(s, jnp.zeros_like(s), w, eps=ksn.EPS, offset=1.0)
    np.testing.assert_allclose(np.asarray(ksn.scale_of(q, d)), np.asarray(r), rtol=1e-5)


def test_forms_are_one_function(ksn):
    """Every form but `none` computes the same pair as the model (`xla`), up to where it rounds u."""
    ksn.D, ksn.K = 256, 384
    ws = ksn.weights(2, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, 256), jnp.float32).astype(jnp.bfloat16)
    a = jax.random.normal(jax.random.key(2), (4, 384), jnp.float32).astype(jnp.bfloat16)
    outs = {f: [o.astype(jnp.float32) for o in ksn.make_run(f, 4, True)(ws, x, a)[-1]] for f in ksn.FORMS}
    for f in ksn.FORMS[1:-1]:
        assert ksn.rel_err(outs[f], outs["xla"]) < 3e-2, f
    assert ksn.rel_err(outs["split_pallas"], outs["split_rows"]) < 1e-2
    assert ksn.rel_err(outs["none"], outs["xla"]) > 0.5        # no norm: a different function


def test_command_line(ksn, tmp_path, capsys):
    out = tmp_path / "ksn.json"
    assert ksn.main(["--small", "--layers", "2", "--sizes", "4", "--steps", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["form"] for r in rows] == list(ksn.FORMS) and all(r["rows"] == 4 for r in rows)
    by = {r["form"]: r for r in rows}
    assert by["split_pallas"]["rel_err_vs_split_rows"] < 1e-2 and by["xla"]["rel_err_vs_xla"] == 0.0
    for argv, message in [(["--forms", "xla,fused"], "--forms: unknown ['fused']"),
                          (["--splits", "5"], "--splits 5 must be a positive divisor of K = 384")]:
        with pytest.raises(SystemExit) as e:
            ksn.main(["--small", "--out", str(out)] + argv)
        assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("rows", [1, 64])
def test_triton_lowering_at_the_real_width(ksn, rows):
    """The kernel lowers to Triton IR at the real width (5120, chunks of 512, 8 slices) for an abstract H200."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    ksn.CHUNK = 512
    S = jax.ShapeDtypeStruct
    shapes = (S((rows, 5120), jnp.bfloat16), S((8, rows, 5120), jnp.float32), S((5120,), jnp.bfloat16))
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda *a: ksn.pallas_add_norm(*a, interpret=False))
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1
