"""The tree delta rule on a chain as the recurrence (pallas_kernels/tree_delta_rule/recurrent.py, opt-in
JAXSPEC_TREE_DELTA_RULE=pallas_recurrent) against the reference's WY form: the kernel in interpret mode, its
dispatch, its Triton lowering for an abstract H200 (CPU), the engine lossless with it (interpreted), and the compiled
kernel at the real heads (`-m gpu`).

Errors are max |x - ref| / max |ref| over the whole output, in fp32: bound 1e-4 (issue 6, fp32 inputs).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.tree_delta_rule import api, arg_specs, pallas_triton, recurrent, reference
from pallas_kernels.tree_delta_rule.arg_specs import Spec, make_inputs
from kernel_tests import on_gpu

BOUND = 1e-4


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def chain_inputs(seed, n, heads, batch=2, correlated=False):
    h, hk, dk, dv = heads
    (q, k, v, g, beta, anc, s0), _ = make_inputs(seed, Spec(batch, n, h, dk, dv, "chain", key_heads=hk,
                                                            correlated=correlated))
    return q, k, v, g, beta, anc, s0


def assert_matches(out, ref):
    for name, x, r in zip(("o", "delta", "G"), out, ref):
        assert x.shape == r.shape, (name, x.shape, r.shape)
        assert np.isfinite(np.asarray(x)).all(), name
        assert rel_err(x, r) < BOUND, (name, rel_err(x, r))


# (value heads, key heads, Dk, Dv): 6 over 2 (each key head serving 3), Dk 40 padded to 64, Dv 24 padded to 32
@pytest.mark.parametrize("heads", [(6, 2, 40, 24), (2, 2, 32, 32)], ids=lambda t: "h%d-hk%d-dk%d-dv%d" % t)
@pytest.mark.parametrize("n", [1, 5, 16, 23, 32])
def test_interpreted_kernel_matches_reference(seed, heads, n):
    """o, Delta and G on chains of 1 to MAX_N nodes (16 = a DFlash block; 23 padded to 32), two programs along
    the value dim where Dv is 32 (block_dv 16)."""
    q, k, v, g, beta, anc, s0 = chain_inputs(seed, n, heads)
    out = recurrent.chain_delta_rule(q, k, v, g, beta, s0, interpret=True, block_dv=16)
    assert_matches(out, reference.tree_delta_rule(q, k, v, g, beta, anc, s0))


def test_correlated_keys(seed):
    """Nearly parallel keys, weak decay and strong writes (the ill-conditioned case of the WY form)."""
    q, k, v, g, beta, anc, s0 = chain_inputs(seed, 16, (6, 2, 16, 24), correlated=True)
    out = recurrent.chain_delta_rule(q, k, v, g, beta, s0, interpret=True)
    want = reference.recurrent_reference(jnp.repeat(q, 3, 2), jnp.repeat(k, 3, 2), v, g, beta, s0)[0]
    assert rel_err(out[0], want) < BOUND


def test_dispatch_runs_the_recurrence_only_for_chains(seed, monkeypatch):
    """pallas_recurrent: a chain of <= MAX_N nodes runs the recurrence; a tree, a chain the caller does not promise,
    and a chain longer than MAX_N run the WY kernels; every case matches the reference."""
    calls = []
    for module, name in ((recurrent, "chain_delta_rule"), (pallas_triton, "tree_delta_rule")):
        def counting(*a, _fn=getattr(module, name), _name=name, **kw):
            calls.append(_name)
            return _fn(*a, **kw)
        monkeypatch.setattr(module, name, counting)
    monkeypatch.setenv(api.ENV_VAR, "pallas_recurrent_interpret")
    chain16 = chain_inputs(seed, 16, (6, 2, 16, 24))
    tree16, _ = make_inputs(seed, Spec(2, 16, 6, 16, 24, "tree", key_heads=2))
    chain40 = chain_inputs(seed, 40, (6, 2, 16, 24))
    for args, chain, want in ((chain16, True, "chain_delta_rule"), (chain16, False, "tree_delta_rule"),
                              (tree16, False, "tree_delta_rule"), (chain40, True, "tree_delta_rule")):
        calls.clear()
        out = api.tree_delta_rule(*args, chain=chain)
        assert calls == [want], (chain, args[0].shape, calls)
        assert_matches(out, reference.tree_delta_rule(*args))


def test_refuses_long_chains_and_bad_shapes():
    q, k, v, g, beta, _, s0 = chain_inputs(0, 33, (2, 2, 16, 16), batch=1)
    with pytest.raises(ValueError, match="1..32 nodes, got 33"):
        recurrent.chain_delta_rule(q, k, v, g, beta, s0, interpret=True)
    q, k, v, g, beta, _, s0 = chain_inputs(0, 4, (2, 2, 16, 16), batch=1)
    with pytest.raises(ValueError, match=r"s0 \(1, 2, 32, 16\)"):
        recurrent.chain_delta_rule(q, k, v, g, beta, jnp.zeros((1, 2, 32, 16)), interpret=True)
    with pytest.raises(ValueError, match=r"g \(1, 4, 1\)"):
        recurrent.chain_delta_rule(q, k, v, g[..., :1], beta, s0, interpret=True)


def test_triton_lowering():
    """The compiled path's lowering for an abstract H200 at the real heads and a DFlash block: one kernel."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    f32, S = jnp.float32, jax.ShapeDtypeStruct
    b, n, h, hk = 1, 16, arg_specs.REAL_HEADS, arg_specs.REAL_KEY_HEADS
    dk, dv = arg_specs.REAL_DK, arg_specs.REAL_DV
    shapes = (S((b, n, hk, dk), f32), S((b, n, hk, dk), f32), S((b, n, h, dv), f32), S((b, n, h), f32),
              S((b, n, h), f32), S((b, h, dk, dv), f32))
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = jax.jit(recurrent.chain_delta_rule).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 1


def test_engine_stays_lossless_with_the_recurrence(tiny_hf, monkeypatch):
    """The engine with the opt-in (interpreted), two prompts: an oracle DFlash chain of 4 (accepted drafts) gives
    the tokens of greedy AR with every op on its jnp reference, and its verify (a block of 4 nodes, not only the
    prefill's short chain) runs the recurrence."""
    from convert.hf import load_target
    from jaxspec.engine import Engine
    from oracle import OracleChain, reference as oracle_reference
    target = load_target(tiny_hf[0], dtype="float32")
    rs = np.random.RandomState(10)
    prompts, n_new = [rs.randint(0, 512, size=13).tolist(), rs.randint(0, 512, size=6).tolist()], 12
    monkeypatch.setenv(api.ENV_VAR, "reference")
    ar = Engine(target).generate(prompts, n_new).tokens
    monkeypatch.setenv(api.ENV_VAR, "pallas_recurrent_interpret")
    calls = []
    fn = recurrent.chain_delta_rule
    monkeypatch.setattr(recurrent, "chain_delta_rule", lambda *a, **kw: calls.append(a[0].shape[:2]) or fn(*a, **kw))
    block = 4
    out = Engine(target, OracleChain(block, 512, ref=oracle_reference(prompts, ar, block))).generate(
        prompts, n_new, seed=1)
    assert out.tokens == ar
    assert out.hist[2:].sum() > 0, out.hist
    assert (2, block) in calls, calls         # the verify of both rows' blocks


@on_gpu
@pytest.mark.parametrize("batch,n,block_dv,num_warps", [(1, 16, 32, 4), (1, 32, 32, 4), (2, 23, 16, 1),
                                                         (2, 16, 64, 2)])
def test_gpu_kernel_matches_reference(seed, batch, n, block_dv, num_warps):
    """The compiled kernel at the real heads (48 value heads over 16 key heads, Dk = Dv = 128), against the
    reference in fp32 (HIGHEST): a DFlash block, the longest chain, a padded one in a batch of 2, and the bench
    sweep's other tilings."""
    heads = (arg_specs.REAL_HEADS, arg_specs.REAL_KEY_HEADS, arg_specs.REAL_DK, arg_specs.REAL_DV)
    q, k, v, g, beta, anc, s0 = chain_inputs(seed, n, heads, batch=batch)
    out = jax.jit(functools.partial(recurrent.chain_delta_rule, block_dv=block_dv, num_warps=num_warps))(
        q, k, v, g, beta, s0)
    assert_matches(out, jax.jit(reference.tree_delta_rule)(q, k, v, g, beta, anc, s0))
