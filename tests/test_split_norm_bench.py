"""bench/next/k_split_norm.py, the micro-benchmark of a residual add + RMSNorm that takes a product's K slices: its
forms agreeing with the model's pair of product and norm (the kernel in interpret mode; its own tests are
tests/test_add_rms_norm_kernel.py), and its command line at small widths."""

import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def ksn(monkeypatch):
    spec = importlib.util.spec_from_file_location("k_split_norm", os.path.join(ROOT, "bench/next/k_split_norm.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "CHUNK", 128)
    return mod


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

