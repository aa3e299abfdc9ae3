"""The commit's GDN state update for every layer in one kernel (pallas_kernels/gdn_commit) against its reference,
and the reference against the state formula written out in numpy.

CPU: the kernel in interpret mode on fresh random inputs per test (several head layouts and path lengths, a
sequence not kept), the Triton lowering at the real shape for an abstract H200, dispatch and argument checks.
The engine through the kernel: tests/test_kernels_engine.py (its flags include JAXSPEC_GDN_COMMIT), per shard:
tests/test_sharding.py. GPU (`-m gpu`): the compiled kernel at the real shape. Errors are max |x - ref| / max |ref|.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_tests import check_dispatch, on_gpu
from pallas_kernels import dispatch
from pallas_kernels.gdn_commit import api, pallas_triton, reference
from pallas_kernels.gdn_commit.arg_specs import REAL, make_inputs

def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def test_reference_is_the_state_formula(seed):
    """S1 = e^G S0 + sum_p w_p k_p Delta_p^T per layer, sequence and value head (k at the head's key head), and S0
    itself for a sequence not kept: written out in numpy, loop by loop."""
    args = make_inputs(seed, layers=2, b=2, h=6, hk=2, dk=4, dv=3, p=5)
    s0s, w, k, delta, eg, keep = (np.asarray(x) if not isinstance(x, tuple) else [np.asarray(s) for s in x]
                                  for x in args)
    got = reference.gdn_commit(*args)
    for l in range(2):
        want = s0s[l].copy()
        for b in range(2):
            if not keep[b]:
                continue
            for h in range(6):
                u = sum(w[l, b, p, h] * np.outer(k[l, b, p, h // 3], delta[l, b, p, h]) for p in range(5))
                want[b, h] = eg[l, b, h] * s0s[l][b, h] + u
        np.testing.assert_allclose(np.asarray(got[l]), want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(got[0][0]), s0s[0][0])          # the kept sequence moved
    np.testing.assert_array_equal(np.asarray(got[1][1]), s0s[1][1])   # the other did not


@pytest.mark.parametrize("layers,b,h,hk,dk,dv,p,per,block_dv", [
    (3, 2, 6, 2, 16, 16, 5, 1, 16),      # key heads shared by 3 value heads; path padded to 16
    (4, 1, 4, 4, 32, 16, 16, 4, 16),     # one key head a value head; 4 layers a program
    (2, 3, 4, 2, 16, 32, 17, 2, 16),     # a path of 17 (padded to 32); two value slices
    (5, 2, 2, 1, 16, 16, 1, 4, 32),      # an AR step's path of one; 5 layers: one a program
])
def test_kernel_matches_reference(seed, layers, b, h, hk, dk, dv, p, per, block_dv):
    args = make_inputs(seed, layers=layers, b=b, h=h, hk=hk, dk=dk, dv=dv, p=p)
    want = reference.gdn_commit(*args)
    got = pallas_triton.gdn_commit(*args, interpret=True, per=per, block_dv=block_dv)
    keep = np.asarray(args[-1])
    assert len(got) == layers
    for g, r, s0 in zip(got, want, args[0]):
        assert g.shape == r.shape and g.dtype == jnp.float32
        assert rel_err(g, r) < 1e-5
        assert not np.allclose(np.asarray(g)[keep], np.asarray(s0)[keep])       # an update happened
        np.testing.assert_array_equal(np.asarray(g)[~keep], np.asarray(s0)[~keep])   # not kept: S0 exactly


def test_kernel_writes_over_donated_states(seed):
    """Inside a jit that donates the states the kernel's outputs take their buffers (input_output_aliases)."""
    args = make_inputs(seed, layers=3, b=1, h=2, hk=1, dk=16, dv=16, p=4)
    f = jax.jit(lambda s, *a: pallas_triton.gdn_commit(s, *a, interpret=True), donate_argnums=0)
    text = f.lower(*args).as_text()
    assert text.count("tf.aliasing_output") == 3, text[:2000]


def test_triton_lowering():
    """The compiled path's lowering to Triton IR at the real shape for an abstract H200 (compiling it needs the
    GPU): one kernel for the 48 layers."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    args = make_inputs(0, **REAL)
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda *a: pallas_triton.gdn_commit(*a))
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1


def test_dispatch(monkeypatch):
    check_dispatch(api, monkeypatch, gpu_default="pallas_triton")
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    monkeypatch.delenv(api.ENV_VAR, raising=False)
    assert api.resolve(dk=16, dv=16, p=16) == "pallas_triton"     # the GPU default
    assert api.resolve(dk=16, dv=16, p=1) == "reference"          # but not for an AR step
    with dispatch.differentiable():                               # a traced loss: the jnp form
        assert api.resolve(dk=16, dv=16, p=16) == "reference"
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    assert api.resolve(dk=16, dv=16, p=16) == "pallas_interpret"
    assert api.resolve(dk=8, dv=16, p=16) == "reference"         # head dims the kernel does not take
    assert api.resolve(dk=16, dv=16, p=65) == "reference"        # a path longer than the kernel's dot takes
    assert api.resolve(dk=16, dv=16, p=1) == "reference"         # an AR step: XLA's update is shorter
    assert api.resolve("pallas_interpret", dk=16, dv=16, p=1) == "pallas_interpret"
    assert api.resolve("pallas_interpret", dk=8, dv=16) == "pallas_interpret"   # named: the kernel refuses them


def test_api_falls_back_and_the_kernel_refuses(seed, monkeypatch):
    """Through the api, head dims of 8 run the reference under the kernel's flag; the kernel named refuses them."""
    args = make_inputs(seed, layers=2, b=2, h=2, hk=1, dk=8, dv=16, p=3)
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    for g, r in zip(api.gdn_commit(*args), reference.gdn_commit(*args)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
    with pytest.raises(ValueError, match="Dk=8"):
        api.gdn_commit(*args, implementation="pallas_interpret")


def test_bad_arguments_are_refused(seed):
    s0s, w, k, delta, eg, keep = make_inputs(seed, layers=2, b=2, h=4, hk=2, dk=16, dv=16, p=3)
    with pytest.raises(ValueError, match="delta"):
        reference.gdn_commit(s0s, w, k, delta[:, :, :2], eg, keep)
    with pytest.raises(ValueError, match="keep"):
        reference.gdn_commit(s0s, w, k, delta, eg, keep.astype(jnp.int32))
    with pytest.raises(ValueError, match="Hk dividing"):
        reference.gdn_commit(s0s, w, jnp.concatenate([k, k[:, :, :, :1]], 3), delta, eg, keep)
    with pytest.raises(ValueError, match="s0s"):
        reference.gdn_commit((s0s[0], s0s[1].astype(jnp.bfloat16)), w, k, delta, eg, keep)
    with pytest.raises(ValueError, match="eg"):
        reference.gdn_commit(s0s, w, k, delta, eg[:1], keep)
    with pytest.raises(ValueError, match="block_dv"):
        pallas_triton.gdn_commit(s0s, w, k, delta, eg, keep, interpret=True, block_dv=24)


@on_gpu
@pytest.mark.parametrize("p", [1, 16, 64])
def test_gpu_kernel_matches_reference(seed, p):
    args = make_inputs(seed, **(REAL | dict(b=2, p=p)))
    with jax.default_matmul_precision("highest"):
        want = jax.jit(reference.gdn_commit)(*args)
    got = jax.jit(pallas_triton.gdn_commit)(*args)
    keep = np.asarray(args[-1])
    for g, r, s0 in zip(got, want, args[0]):
        assert rel_err(g, r) < 1e-5
        np.testing.assert_array_equal(np.asarray(g)[~keep], np.asarray(s0)[~keep])


def test_bench_runs_and_writes_json(tmp_path):
    """The benchmark's harness (on the CPU: a small shape, the kernel interpreted, 1 traced call)."""
    import json

    from pallas_kernels.gdn_commit import bench
    bench.main(["--paths", "3", "--iters", "1", "--json", str(tmp_path / "b.json")])
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [r["impl"] for r in rows] == ["reference", "pallas_triton"]
    assert all(r["rel_err_vs_reference"] < 1e-5 and 0 < r["device_us"] < float("inf") for r in rows), rows
    # 4 layers' [1, 4, 32, 32] fp32 states read and written, the path's w [4, 1, 3, 4], k [4, 1, 3, 2, 32],
    # delta [4, 1, 3, 4, 32], eg [4, 1, 4] fp32 and keep [1] bool read
    want = 2 * 4 * 4 * 32 * 32 * 4 + (4 * 3 * 4 + 4 * 3 * 2 * 32 + 4 * 3 * 4 * 32 + 4 * 4) * 4 + 1
    assert all(r["bytes"] == want for r in rows), rows
    assert rows[1]["device_bytes_per_s"] == pytest.approx(want / (rows[1]["device_us"] * 1e-6))
    bench.main(["--paths", "3", "--iters", "1", "--sweep", "--json", str(tmp_path / "b.json")])
    assert len(json.loads((tmp_path / "b.json").read_text())["rows"]) == 5
