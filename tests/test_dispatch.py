"""The kernels' flags: every JAXSPEC_* variable jaxspec reads is known to `dispatch`, and one it does not read (a
misspelling, or a flag since removed) is refused where an implementation is chosen, instead of being ignored and
then recorded in a result's flags as if it had chosen something."""

from __future__ import annotations

import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import dispatch
from pallas_kernels.add_rms_norm import api as add_rms_norm

ROOT = Path(__file__).resolve().parents[1]


def test_every_flag_the_code_names_is_known():
    named = set()
    for d in ("jaxspec", "pallas_kernels", "bench", "convert"):
        for f in (ROOT / d).rglob("*.py"):
            named |= set(re.findall(r"[\"'](JAXSPEC_[A-Z0-9_]+)[\"']", f.read_text()))
    assert named and named <= set(dispatch.FLAGS), sorted(named - set(dispatch.FLAGS))
    assert set(dispatch.OP_FLAGS) <= named      # each op's flag is one the code reads


def test_a_misspelt_flag_is_refused_naming_the_nearest(monkeypatch):
    x = jax.random.normal(jax.random.key(0), (2, 64))
    w = jnp.ones((64,))
    add_rms_norm.add_rms_norm(x, x, w, eps=1e-6, offset=1.0)                    # no JAXSPEC_* set: runs
    monkeypatch.setenv("JAXSPEC_ADD_RMS_NORN", "reference")
    with pytest.raises(ValueError, match=r"environment variable JAXSPEC_ADD_RMS_NORN is set, but jaxspec reads no "
                                         r"such variable \(did you mean JAXSPEC_ADD_RMS_NORM\?\)"):
        add_rms_norm.add_rms_norm(x, x, w, eps=1e-6, offset=1.0)
    with pytest.raises(ValueError, match="JAXSPEC_ADD_RMS_NORN is set"):
        dispatch.flags()


def test_flags_records_the_choices_only(monkeypatch):
    for k in dispatch.FLAGS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("JAXSPEC_VERIFY", "xla")
    monkeypatch.setenv("JAXSPEC_LOOP_GRAPHS", "ar")
    for k in dispatch.OTHER_FLAGS:
        monkeypatch.setenv(k, "0")
    assert dispatch.flags() == {"JAXSPEC_LOOP_GRAPHS": "ar", "JAXSPEC_VERIFY": "xla"}
    monkeypatch.setenv("JAXSPEC_TREE_ATTENTION", "")       # empty: chooses nothing, so not recorded
    assert dispatch.flags() == {"JAXSPEC_LOOP_GRAPHS": "ar", "JAXSPEC_VERIFY": "xla"}
    monkeypatch.setenv("JAXSPEC_STATE_UPDATE", "1")         # removed in 43d2d6b
    with pytest.raises(ValueError, match="JAXSPEC_STATE_UPDATE is set, but jaxspec reads no such variable"):
        dispatch.check_flags()


@pytest.mark.parametrize("flag", dispatch.CHOICE_FLAGS)
def test_check_flags_refuses_a_value_its_flag_does_not_take(flag, monkeypatch):
    """Every choice flag's value is checked with the names, before any work (an op's was first checked when the
    model was traced, after the load); each value the flag's reader takes passes."""
    for k in dispatch.FLAGS:
        monkeypatch.delenv(k, raising=False)
    readers = {"JAXSPEC_LOOP_GRAPHS": ("none", "ar", "all"), "JAXSPEC_DDTREE_TOP_K": ("sort", "count")}
    taken = readers.get(flag) or __import__(f"pallas_kernels.{flag[8:].lower()}.api", fromlist=["x"]).IMPLEMENTATIONS
    assert dispatch.flag_values(flag) == taken
    for value in taken:
        monkeypatch.setenv(flag, value)
        dispatch.check_flags()
    monkeypatch.setenv(flag, "bogus")
    with pytest.raises(ValueError, match=f"^{flag}='bogus': expected one of {', '.join(taken)}$"):
        dispatch.check_flags()


def test_an_engine_refuses_a_misspelt_flag(tiny_hf, monkeypatch):
    """The loop graphs' and the tree build's flags are read outside `resolve`: the engine checks at construction."""
    from convert.hf import load_target
    from jaxspec.engine import Engine
    target = load_target(tiny_hf[0], dtype="float32")
    Engine(target)
    monkeypatch.setenv("JAXSPEC_LOOP_GRAPH", "none")
    with pytest.raises(ValueError, match=r"JAXSPEC_LOOP_GRAPH is set.*did you mean JAXSPEC_LOOP_GRAPHS\?"):
        Engine(target)


@pytest.mark.parametrize("flag", dispatch.OP_FLAGS)
def test_a_flag_forcing_a_gpu_kernel_is_refused_without_a_gpu(flag):
    """`check_gpu_flags`: each compiled-kernel value of an op's flag is refused on a CPU backend, naming the flag and
    the values that run there; on a GPU backend, and for the other values, nothing is refused."""
    values = dispatch.flag_values(flag)
    here = [v for v in values if v not in dispatch.GPU_ONLY]
    assert "pallas_interpret" in here and "reference" in here or flag == "JAXSPEC_CHAIN_ATTENTION"
    for value in values:
        env = {flag: value}
        dispatch.check_gpu_flags(env, backend="gpu")
        if value in here:
            dispatch.check_gpu_flags(env, backend="cpu")
            continue
        with pytest.raises(ValueError, match=f"^{flag}='{value}' forces a GPU kernel, but jax's default backend "
                                             f"here is 'cpu'; unset it or use one of {', '.join(here)}$"):
            dispatch.check_gpu_flags(env, backend="cpu")
    assert any(v in dispatch.GPU_ONLY for v in values)


def test_clis_refuse_a_forced_gpu_kernel_before_loading(monkeypatch, capsys):
    """On this CPU-only machine `jaxspec.generate` and a bench CLI stop with the parser's one line, status 2."""
    from bench import tree_build
    from jaxspec import generate
    assert jax.default_backend() == "cpu"
    monkeypatch.setenv("JAXSPEC_TREE_ATTENTION", "pallas_triton")
    for main in (generate.main, tree_build.main):
        with pytest.raises(SystemExit) as e:
            main(["--model", "/nonexistent"] if main is generate.main else [])
        assert e.value.code == 2
        assert "JAXSPEC_TREE_ATTENTION='pallas_triton' forces a GPU kernel" in capsys.readouterr().err


def test_the_gpu_flag_check_comes_after_the_clis_claim_on_device_memory(monkeypatch):
    """Looking up the backend starts the GPU client, which reads the memory fraction only then: `parse_args` claims
    it (jaxspec.sharding.claim_device_memory) before `check_gpu_flags` looks, so a run with a kernel flag set gets
    the pool the CLIs give every run."""
    import argparse

    from jaxspec import sharding
    for v in sharding.FRACTION_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("JAXSPEC_GDN_DECODE", "pallas_triton")
    seen = []
    monkeypatch.setattr(dispatch.jax, "default_backend",
                        lambda: seen.append(os.environ.get(sharding.FRACTION_VARS[0])) or "gpu")
    dispatch.parse_args(argparse.ArgumentParser(), [])
    assert seen == [sharding.MEM_FRACTION]


def test_a_forced_kernel_beyond_its_shapes_is_refused_naming_the_flag(monkeypatch):
    """Forcing the tree delta rule's or chain attention's kernels on shapes they do not take is refused naming the
    variable (or the argument) that forced them, not inside the kernel in another op's words."""
    from pallas_kernels.chain_attention import api as chain
    from pallas_kernels.tree_delta_rule import api as tdr
    r = np.random.default_rng(0)
    f32 = lambda *s: jnp.asarray(r.standard_normal(s), jnp.float32)
    n = 129
    anc = jnp.asarray(np.tril(np.ones((n, n), bool))[None])
    args = (f32(1, n, 1, 8), f32(1, n, 1, 8), f32(1, n, 1, 8), -jnp.abs(f32(1, n, 1)), f32(1, n, 1), anc,
            f32(1, 1, 8, 8))
    monkeypatch.setenv(tdr.ENV_VAR, "pallas_interpret")
    with pytest.raises(ValueError, match=r"^JAXSPEC_TREE_DELTA_RULE='pallas_interpret': the tree delta rule kernels "
                                         r"take 1\.\.128 nodes, and this block has 129; use xla$"):
        tdr.tree_delta_rule(*args)
    with pytest.raises(ValueError, match=r"^implementation='pallas_triton': the tree delta rule kernels take 1\.\.128"):
        tdr.tree_delta_rule(*args, implementation="pallas_triton")

    q, kv = f32(1, 4, 2, 24), f32(1, 32, 1, 24)
    monkeypatch.setenv(chain.ENV_VAR, "pallas_interpret")
    with pytest.raises(ValueError, match=r"^JAXSPEC_CHAIN_ATTENTION='pallas_interpret': the chain attention kernels "
                                         r"take head_dim 16\.\.512, a power of two"):
        chain.chain_attention(q, kv[:, :4], kv[:, :4], kv, kv, jnp.array([3], jnp.int32))


def test_kernels_skip_shapes_they_would_not_build_well(monkeypatch):
    """add_rms_norm at a width walked in more than 64 chunks runs the reference even when forced (the unrolled walk
    is slow to lower at D = 5121); tree attention's kernel refuses head dims whose tiles overflow shared memory."""
    from pallas_kernels.add_rms_norm import pallas_triton as arn_kernel
    from pallas_kernels.add_rms_norm import reference as arn_reference
    from pallas_kernels.tree_attention import pallas_triton as ta_kernel
    calls = []
    kernel = arn_kernel.add_rms_norm
    monkeypatch.setattr(arn_kernel, "add_rms_norm", lambda *a, **kw: calls.append(a[0].shape) or kernel(*a, **kw))
    r = np.random.default_rng(1)
    for d, runs in ((5121, False), (64 * 8 + 8, False), (64 * 8, True), (5120, True)):
        x, u = (jnp.asarray(r.standard_normal((2, d)), jnp.float32) for _ in range(2))
        w = jnp.asarray(r.standard_normal(d), jnp.float32)
        calls.clear()
        got = add_rms_norm.add_rms_norm(x, u, w, eps=1e-6, offset=1.0, implementation="pallas_interpret")
        want = arn_reference.add_rms_norm(x, u, w, eps=1e-6, offset=1.0)
        assert (calls == [(2, d)]) == runs, (d, calls)
        for g, h in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(h), rtol=1e-5, atol=1e-5)
    assert ta_kernel.supports((1, 1, 8, 512), (1, 64, 1, 512))
    assert not ta_kernel.supports((1, 1, 8, 1024), (1, 64, 1, 1024))
    for itemsize in (2, 4):
        for rows in (1, 16, 65, 1000):
            bq, bk, _ = ta_kernel.tiles(rows, 512, itemsize)
            assert ta_kernel.smem_bytes(bq, bk, 512, itemsize, 2) <= ta_kernel.SMEM_LIMIT
