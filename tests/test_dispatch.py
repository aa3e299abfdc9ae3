"""The kernels' flags: every JAXSPEC_* variable jaxspec reads is known to `dispatch`, and one it does not read (a
misspelling, or a flag since removed) is refused where an implementation is chosen, instead of being ignored and
then recorded in a result's flags as if it had chosen something."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
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
