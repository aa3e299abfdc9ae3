"""Rules of the commit's GDN state update (pallas_kernels/gdn_commit) that tests/test_gdn_commit_kernel.py leaves
open: the kernel (interpret mode) against the state formula written out in numpy at shapes that round its layers a
program down and pad its path, the Triton lowering at paths that are not powers of two, the argument checks, the
api's empty-batch and dispatch rules, and the model's choice of the kernel by path length (jaxspec/model.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import model as model_module
from jaxspec import sharding
from pallas_kernels.gdn_commit import api, pallas_triton, reference
from pallas_kernels.gdn_commit.arg_specs import make_inputs


def _formula(s0s, w, k, delta, eg, keep):
    """S1 = e^G S0 + sum_p w_p k_p Delta_p^T (k at the value head's key head), S0 where not kept: numpy loops."""
    s0s = [np.asarray(s, np.float64) for s in s0s]
    w, k, delta, eg, keep = (np.asarray(x) for x in (w, k, delta, eg, keep))
    layers, b, p, h = w.shape
    rep = h // k.shape[3]
    out = []
    for l in range(layers):
        s1 = s0s[l].copy()
        for bi in range(b):
            if keep[bi]:
                for hi in range(h):
                    u = sum(w[l, bi, j, hi] * np.outer(k[l, bi, j, hi // rep], delta[l, bi, j, hi])
                            for j in range(p))
                    s1[bi, hi] = eg[l, bi, hi] * s0s[l][bi, hi] + u
        out.append(s1)
    return out


@pytest.mark.parametrize("layers,per,p,block_dv", [
    (6, 4, 33, 16),      # 6 layers, 4 asked a program: 2 a program; a path of 33 padded to 64
    (3, 8, 7, 64),       # more layers asked than there are; block_dv clipped to Dv = 32
])
def test_kernel_is_the_state_formula(seed, layers, per, p, block_dv):
    """The interpreted kernel gives the numpy formula for every layer, head and sequence (the last not kept: S0)."""
    args = make_inputs(seed, layers=layers, b=2, h=4, hk=2, dk=16, dv=32, p=p)
    got = pallas_triton.gdn_commit(*args, interpret=True, per=per, block_dv=block_dv)
    for g, want, s0 in zip(got, _formula(*args), args[0]):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-5)
        assert not np.allclose(np.asarray(g)[0], np.asarray(s0)[0])


def test_layers_a_program_are_a_power_of_two_dividing_the_layer_count():
    """`_per` gives the largest power of two <= per that divides the layer count (Triton's blocks need powers of
    two); 1 at the least."""
    for layers, per, want in [(6, 4, 2), (6, 3, 2), (12, 8, 4), (12, 3, 2), (5, 4, 1), (3, 8, 1), (8, 16, 8),
                              (48, 4, 4), (48, 6, 4), (7, 0, 1)]:
        assert pallas_triton._per(layers, per) == want, (layers, per)


@pytest.mark.parametrize("p", [17, 33])
def test_triton_lowering_pads_a_path_to_a_power_of_two(p):
    """The compiled kernel lowers to one Triton call at paths of 17 and 33 nodes (padded to 32 and 64 rows: the
    Triton lowering takes power-of-two arrays only), for an abstract H200."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh
    args = make_inputs(0, layers=2, b=1, h=2, hk=1, dk=16, dv=16, p=p)
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda *a: pallas_triton.gdn_commit(*a))
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1


def test_bad_shapes_are_refused_naming_the_argument(seed):
    """No states, w with another head count, k with another key dim or no key heads, keep of one row for two
    sequences and 3-D states are refused by name, by the reference and the api; so are a block_dv below 16 and, by
    the kernel, a path of no nodes."""
    s0s, w, k, delta, eg, keep = make_inputs(seed, layers=2, b=2, h=4, hk=2, dk=16, dv=16, p=3)
    for fn in (reference.gdn_commit, api.gdn_commit):
        with pytest.raises(ValueError, match="s0s is empty"):
            fn((), w, k, delta, eg, keep)
        with pytest.raises(ValueError, match="Hk dividing"):
            fn(s0s, w, k[:, :, :, :0], delta, eg, keep)
        with pytest.raises(ValueError, match="w "):
            fn(s0s, w[..., :1], k, delta, eg, keep)
        with pytest.raises(ValueError, match="k "):
            fn(s0s, w, k[..., :1], delta, eg, keep)
        with pytest.raises(ValueError, match="keep"):
            fn(s0s, w, k, delta, eg, keep[:1])
        with pytest.raises(ValueError, match="s0s"):
            fn(tuple(s[0] for s in s0s), w, k, delta, eg, keep)
    with pytest.raises(ValueError, match="block_dv"):
        pallas_triton.gdn_commit(s0s, w, k, delta, eg, keep, interpret=True, block_dv=8)
    with pytest.raises(ValueError, match="P=0"):
        pallas_triton.gdn_commit(s0s, w[:, :, :0], k[:, :, :0], delta[:, :, :0], eg, keep, interpret=True)


@pytest.mark.parametrize("b,h", [(0, 4), (2, 0)])
def test_empty_batch_or_heads_give_the_states_back(seed, b, h):
    """No sequences or no heads: the api gives the states as they were (the reference's result) even with the
    kernel named."""
    args = make_inputs(seed, layers=2, b=2, h=4, hk=2, dk=16, dv=16, p=3)
    s0s, w, k, delta, eg, keep = args
    hk = 2 if h else 1
    s0s = tuple(s[:b, :h] for s in s0s)
    k = jnp.zeros((2, b, 3, hk, 16), jnp.float32) + k[:, :b, :, :1]
    got = api.gdn_commit(s0s, w[:, :b, :, :h], k, delta[:, :b, :, :h], eg[:, :b, :h], keep[:b],
                         implementation="pallas_interpret")
    assert len(got) == 2
    for g, s in zip(got, s0s):
        assert g.shape == s.shape and g.dtype == jnp.float32
        np.testing.assert_array_equal(np.asarray(g), np.asarray(s))


def test_model_runs_the_kernel_for_paths_of_two_or_more(seed, monkeypatch):
    """Under JAXSPEC_GDN_COMMIT=pallas_interpret the model's commit update runs the kernel for a path of 3 nodes of
    one sequence, and the reference for an AR step's path of one node of 2 sequences; both give the formula."""
    calls = []
    fn = pallas_triton.gdn_commit
    monkeypatch.setattr(pallas_triton, "gdn_commit", lambda *a, **kw: calls.append(a[1].shape) or fn(*a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    for b, p, runs in [(1, 3, True), (2, 1, False), (3, 2, True)]:
        calls.clear()
        args = make_inputs(seed + p, layers=2, b=b, h=2, hk=1, dk=16, dv=16, p=p, keep=[True] * b)
        got = model_module._gdn_commit(*args)
        assert bool(calls) == runs, (b, p, calls)
        for g, want in zip(got, _formula(*args)):
            np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-5)


def test_resolve_without_both_head_dims_keeps_the_flag(monkeypatch):
    """resolve gives the flag's implementation unless it knows both head dims (then it checks them and p)."""
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    assert api.resolve() == "pallas_interpret"
    assert api.resolve(dk=16) == "pallas_interpret"
    assert api.resolve(dv=16) == "pallas_interpret"
    assert api.resolve(dk=16, dv=16) == "reference"          # p = 1: an AR step


def test_model_runs_the_kernel_per_shard_for_one_sequence(seed, monkeypatch):
    """Under a mesh of 2 model shards (one data shard) the model's commit update for one sequence's path of 3 nodes
    runs the kernel per shard (half the value heads each), giving the formula."""
    shapes = []
    fn = pallas_triton.gdn_commit
    monkeypatch.setattr(pallas_triton, "gdn_commit", lambda *a, **kw: shapes.append(a[0][0].shape) or fn(*a, **kw))
    monkeypatch.setenv(api.ENV_VAR, "pallas_interpret")
    args = make_inputs(seed, layers=2, b=1, h=4, hk=2, dk=16, dv=16, p=3, keep=[True])
    with jax.set_mesh(sharding.make_mesh(tp=2, dp=1)):
        got = jax.jit(model_module._gdn_commit)(*args)
    assert shapes == [(1, 2, 16, 16)], shapes
    for g, want in zip(got, _formula(*args)):
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-5)
