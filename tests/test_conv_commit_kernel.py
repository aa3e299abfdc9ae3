"""The commit's conv-history update for every layer in one kernel (pallas_kernels/conv_commit) against its
reference, and the reference against the window written out in numpy.

CPU: the kernel in interpret mode (windows that keep history rows, windows of nodes only, a sequence not kept,
bf16 and fp32), inside a jit that donates the histories (the in-place case), the Triton lowering at the real shape
for an abstract H200, dispatch and argument checks. The engine through the kernel: tests/test_kernels_engine.py
(its flags include JAXSPEC_CONV_COMMIT); per shard: tests/test_sharding.py. GPU (`-m gpu`): the compiled kernel at
the real shape, donated, equal to the reference bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_tests import check_dispatch, on_gpu
from pallas_kernels import dispatch
from pallas_kernels.conv_commit import api, pallas_triton, reference
from pallas_kernels.conv_commit.arg_specs import REAL, make_inputs


def as_np(xs):
    return [np.asarray(x.astype(jnp.float32)) for x in xs]


def windows(b, km1, n):
    """A window per sequence: depth 0 (history rows 1.. then the first node), then deeper ones, cycling."""
    return jnp.asarray([[d + 1 + r for r in range(km1)] for d in (np.arange(b) * 2) % n], jnp.int32)


def test_reference_is_the_window(seed):
    """Row r of the new history is row win[b, r] of concat(history, conv_in); a sequence not kept keeps its own."""
    hists, conv_ins, _, _ = make_inputs(seed, layers=2, b=3, km1=3, n=4, c=5, dtype=jnp.float32)
    win = jnp.asarray([[1, 2, 3], [5, 6, 4], [0, 0, 6]], jnp.int32)       # any rows, in any order
    keep = jnp.asarray([True, True, False])
    got = as_np(reference.conv_commit(hists, conv_ins, win, keep))
    for l in range(2):
        h, x = np.asarray(hists[l]), np.asarray(conv_ins[l])
        ext = np.concatenate([h, x], 1)
        want = h.copy()
        for b in range(2):
            want[b] = ext[b, np.asarray(win)[b]]
        np.testing.assert_array_equal(got[l], want)
    assert not np.array_equal(got[0][:2], np.asarray(hists[0])[:2])


@pytest.mark.parametrize("layers,b,km1,n,c,per,block_c,dtype", [
    (3, 2, 3, 5, 48, 1, 16, jnp.bfloat16),     # 3 channel blocks of 16; one layer a program
    (4, 3, 3, 16, 64, 4, 1024, jnp.bfloat16),  # one channel block; 4 layers a program
    (5, 2, 2, 3, 24, 2, 8, jnp.float32),       # a conv of kernel 3; 5 layers: one a program
    (2, 1, 3, 1, 32, 1, 32, jnp.bfloat16),     # an AR step: one node
])
def test_kernel_matches_reference(seed, layers, b, km1, n, c, per, block_c, dtype):
    hists, conv_ins, _, keep = make_inputs(seed, layers=layers, b=b, km1=km1, n=n, c=c, dtype=dtype)
    win = windows(b, km1, n)
    want = as_np(reference.conv_commit(hists, conv_ins, win, keep))
    got = pallas_triton.conv_commit(hists, conv_ins, win, keep, interpret=True, per=per, block_c=block_c)
    assert [(g.shape, g.dtype) for g in got] == [(h.shape, h.dtype) for h in hists]
    for g, w in zip(as_np(got), want):
        np.testing.assert_array_equal(g, w)
    moved = np.asarray(keep)
    assert not np.array_equal(as_np(got)[0][moved], as_np(hists)[0][moved])


def test_kernel_in_place_under_donation(seed):
    """Inside a jit that donates the histories the kernel writes over them (input_output_aliases), and a window
    that moves history rows (depth 0: rows 1 and 2 to 0 and 1) still reads each old row before it is written."""
    hists, conv_ins, _, keep = make_inputs(seed, layers=3, b=2, km1=3, n=4, c=32)
    win = jnp.asarray([[1, 2, 3], [2, 3, 4]], jnp.int32)
    keep = jnp.asarray([True, True])
    want = as_np(reference.conv_commit(hists, conv_ins, win, keep))
    f = jax.jit(lambda h, *a: pallas_triton.conv_commit(h, *a, interpret=True), donate_argnums=0)
    assert f.lower(hists, conv_ins, win, keep).as_text().count("tf.aliasing_output") == 3
    got = f(tuple(jnp.copy(h) for h in hists), conv_ins, win, keep)
    for g, w in zip(as_np(got), want):
        np.testing.assert_array_equal(g, w)


def test_triton_lowering():
    """The compiled path's lowering to Triton IR at the real shape for an abstract H200 (compiling it needs the
    GPU): one kernel for the 48 layers, the histories' buffers aliased to its outputs."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    args = make_inputs(0, **REAL)
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda *a: pallas_triton.conv_commit(*a), donate_argnums=0)
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1
    assert hlo.count("tf.aliasing_output") == REAL["layers"]


def test_dispatch(monkeypatch):
    check_dispatch(api, monkeypatch, gpu_default="pallas_triton")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    with dispatch.differentiable():                               # a traced loss: the jnp form
        assert api.resolve() == "reference"
    assert api.resolve() == "pallas_triton"


def test_api_runs_the_chosen_implementation(seed, monkeypatch):
    args = make_inputs(seed, layers=2, b=2, km1=3, n=4, c=16)
    want = as_np(reference.conv_commit(*args))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    calls = []
    fn = pallas_triton.conv_commit
    monkeypatch.setattr(pallas_triton, "conv_commit", lambda *a, **k: calls.append(k) or fn(*a, **k))
    for g, w in zip(as_np(api.conv_commit(*args)), want):
        np.testing.assert_array_equal(g, w)
    assert calls == [dict(interpret=True)]
    empty = make_inputs(seed, layers=2, b=0, km1=3, n=4, c=16)        # an empty batch: the reference
    assert [h.shape for h in api.conv_commit(*empty)] == [(0, 3, 16)] * 2 and len(calls) == 1


def test_bad_arguments_are_refused(seed):
    hists, conv_ins, win, keep = make_inputs(seed, layers=2, b=2, km1=3, n=4, c=16)
    with pytest.raises(ValueError, match="hists is empty"):
        reference.conv_commit((), (), win, keep)
    with pytest.raises(ValueError, match="hists must be"):
        reference.conv_commit((hists[0], hists[1].astype(jnp.float32)), conv_ins, win, keep)
    with pytest.raises(ValueError, match="1 conv_ins for 2 hists"):
        reference.conv_commit(hists, conv_ins[:1], win, keep)
    with pytest.raises(ValueError, match="conv_ins must be"):
        reference.conv_commit(hists, (conv_ins[0], conv_ins[1][:, :, :8]), win, keep)
    with pytest.raises(ValueError, match="win"):
        reference.conv_commit(hists, conv_ins, win.astype(jnp.float32), keep)
    with pytest.raises(ValueError, match="keep"):
        reference.conv_commit(hists, conv_ins, win, keep.astype(jnp.int32))
    with pytest.raises(ValueError, match="block_c"):
        pallas_triton.conv_commit(hists, conv_ins, win, keep, interpret=True, block_c=0)


@on_gpu
@pytest.mark.parametrize("n", [1, 16, 64])
def test_gpu_kernel_matches_reference(seed, n):
    hists, conv_ins, _, keep = make_inputs(seed, **(REAL | dict(b=3, n=n)))
    win = windows(3, REAL["km1"], n)
    want = as_np(jax.jit(reference.conv_commit)(hists, conv_ins, win, keep))
    step = jax.jit(pallas_triton.conv_commit, donate_argnums=0)
    got = as_np(step(tuple(jnp.copy(h) for h in hists), conv_ins, win, keep))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_bench_runs_and_writes_json(tmp_path):
    """The benchmark's harness (on the CPU: a small shape, the kernel interpreted, 1 traced call)."""
    import json

    from pallas_kernels.conv_commit import bench
    bench.main(["--iters", "1", "--json", str(tmp_path / "b.json")])
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [r["impl"] for r in rows] == ["reference", "pallas_triton"]
    assert all(r["equal_to_reference"] and 0 < r["device_us"] < float("inf") for r in rows), rows
    # 4 layers' [1, 3, 64] bf16 histories' rows read and written, win [1, 3] int32 and keep [1] bool read
    assert all(r["bytes"] == 2 * 4 * 3 * 64 * 2 + 3 * 4 + 1 for r in rows), rows
    assert rows[1]["device_bytes_per_s"] == pytest.approx(rows[1]["bytes"] / (rows[1]["device_us"] * 1e-6))
    bench.main(["--iters", "1", "--sweep", "--json", str(tmp_path / "b.json")])
    assert len(json.loads((tmp_path / "b.json").read_text())["rows"]) == 5
