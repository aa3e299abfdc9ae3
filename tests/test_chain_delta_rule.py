"""The delta rule over a long chain (pallas_kernels/tree_delta_rule/chain.py) against the token-by-token
recurrence: the jnp solvers, the kernels in interpret mode, their Triton lowering for an abstract H200 (CPU),
and the compiled kernels at the real shape (`-m gpu`).

Errors are max |x - ref| / max |ref| over the whole output, in fp32: bound 1e-4 (issue 6, fp32 inputs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.tree_delta_rule import arg_specs, pallas_triton, reference
from pallas_kernels.tree_delta_rule.arg_specs import Spec, make_inputs
from pallas_kernels.tree_delta_rule.chain import chain_delta_rule
from kernel_tests import on_gpu

BOUND = 1e-4
# (value heads, key heads, Dk, Dv): 6 over 2, each key head serving 3 value heads; Dv 24 is padded to 32
HEADS = [(6, 2, 16, 24), (2, 2, 32, 32)]


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def recurrence(q, k, v, g, beta, s0):
    rep = v.shape[2] // q.shape[2]
    return reference.recurrent_reference(jnp.repeat(q, rep, 2), jnp.repeat(k, rep, 2), v, g, beta, s0)


def chain_inputs(seed, n, heads, batch=2, correlated=False):
    h, hk, dk, dv = heads
    (q, k, v, g, beta, _, s0), _ = make_inputs(seed, Spec(batch, n, h, dk, dv, "chain", key_heads=hk,
                                                          correlated=correlated))
    return q, k, v, g, beta, s0


@pytest.mark.parametrize("implementation", ["pallas_interpret", "xla", "reference"])
@pytest.mark.parametrize("n", [64, 150])
@pytest.mark.parametrize("heads", HEADS, ids=lambda t: "h%d-hk%d-dk%d-dv%d" % t)
def test_chain_matches_recurrence(seed, implementation, n, heads):
    """Outputs and the last state: one whole block, and 64 + 64 + 22 (a padded last block)."""
    args = chain_inputs(seed, n, heads)
    o, s = chain_delta_rule(*args, implementation=implementation)
    ro, rs = recurrence(*args)
    assert o.shape == ro.shape and s.shape == rs.shape
    assert np.isfinite(np.asarray(o)).all() and np.isfinite(np.asarray(s)).all()
    assert rel_err(o, ro) < BOUND and rel_err(s, rs) < BOUND


@pytest.mark.parametrize("implementation", ["pallas_interpret", "xla"])
def test_chain_correlated_keys_and_short_blocks(seed, implementation):
    """Correlated keys with weak decays (where a power series for the inverse cancels), blocks of 16."""
    args = chain_inputs(seed, 70, HEADS[0], correlated=True)
    o, s = chain_delta_rule(*args, chunk=16, implementation=implementation)
    ro, rs = recurrence(*args)
    assert rel_err(o, ro) < BOUND and rel_err(s, rs) < BOUND


@pytest.mark.parametrize("implementation", ["pallas_interpret", "xla"])
def test_inert_tail_leaves_the_state_of_the_prefix(seed, implementation):
    """Tokens with g = beta = 0 leave the state as it is: the model's prefill commits a prefix of each row that
    way (row 0: 100 of 150 tokens, inside the second block; row 1: none, its state must stay s0 exactly)."""
    q, k, v, g, beta, s0 = chain_inputs(seed, 150, HEADS[0])
    live = (jnp.arange(150)[None] < jnp.asarray([100, 0])[:, None])[..., None]
    o, s = chain_delta_rule(q, k, v, jnp.where(live, g, 0.0), jnp.where(live, beta, 0.0), s0,
                            implementation=implementation)
    ro, rs = recurrence(q[:1, :100], k[:1, :100], v[:1, :100], g[:1, :100], beta[:1, :100], s0[:1])
    assert rel_err(o[:1, :100], ro) < BOUND and rel_err(s[:1], rs) < BOUND
    np.testing.assert_array_equal(s[1], s0[1])
    assert not np.allclose(s[0], s0[0], atol=1e-3)


@pytest.mark.parametrize("dk,key_chunk", [(16, 32), (40, 16)])
def test_state_pass_kernel_matches_reference(seed, dk, key_chunk):
    """The state pass alone on random factors: 5 blocks (padded to 8 inside), Dv 24 (padded to 32), two programs
    along the value dim (block_dv 16); the state in one piece (Dk 16) or in four (Dk 40 padded to 64, pieces of
    16). O comes from the states and the Deltas the kernel writes, the last state from its registers."""
    rng = np.random.default_rng(seed)
    b, nb, h, c, dv = 2, 5, 3, 16, 24
    f = lambda *shape: jnp.asarray(0.3 * rng.standard_normal(shape), jnp.float32)
    args = (f(b, nb, h, c, dk), f(b, nb, h, c, dk), f(b, nb, h, dk, c), f(b, nb, h, c, dv), f(b, nb, h, c, c),
            jnp.asarray(rng.uniform(0.2, 1.0, (b, nb, h)), jnp.float32), f(b, h, dk, dv))
    o, s = pallas_triton.state_pass(*args, interpret=True, block_dv=16, key_chunk=key_chunk)
    ro, rs = reference.state_pass(*args)
    assert o.shape == ro.shape and s.shape == rs.shape
    assert rel_err(o, ro) < BOUND and rel_err(s, rs) < BOUND


def test_block_factors_kernel_matches_reference(seed):
    """Tb and P (zero above the diagonal, as the products after them need) and G from `_prepare_kernel`."""
    q, k, _, g, beta, _ = chain_inputs(seed, 64, HEADS[0], batch=3)
    got = pallas_triton.block_factors(q, k, g, beta, interpret=True)
    want = reference.block_factors(q, k, g, beta)
    for name, x, r in zip(("Tb", "P", "G"), got, want):
        assert x.shape == r.shape, name
        assert rel_err(x, r) < BOUND, name
    assert not np.asarray(jnp.triu(got[0], 1)).any() and not np.asarray(jnp.triu(got[1], 1)).any()


def test_refuses_bad_shapes():
    q, k, v, g, beta, s0 = chain_inputs(0, 20, HEADS[0], batch=1)
    with pytest.raises(ValueError, match=r"beta \(1, 19, 6\)"):
        chain_delta_rule(q, k, v, g, beta[:, :19], s0)
    with pytest.raises(ValueError, match="multiple of 16"):
        pallas_triton.block_factors(q[:, :20], k[:, :20], g[:, :20], beta[:, :20], interpret=True)


@pytest.mark.parametrize("n", [200, 8192])
def test_chain_triton_lowering(n):
    """The compiled path's lowering for an abstract H200 at the real heads: the prepare kernel over all blocks and
    one state-pass kernel, whatever the length (no launch per block), and no triangular solve."""
    from jax.sharding import AbstractDevice, AbstractMesh, use_abstract_mesh

    f32, S = jnp.float32, jax.ShapeDtypeStruct
    b, h, hk, dk, dv = 1, arg_specs.REAL_HEADS, arg_specs.REAL_KEY_HEADS, arg_specs.REAL_DK, arg_specs.REAL_DV
    shapes = (S((b, n, hk, dk), f32), S((b, n, hk, dk), f32), S((b, n, h, dv), f32), S((b, n, h), f32),
              S((b, n, h), f32), S((b, h, dk, dv), f32))
    h200 = AbstractDevice(device_kind="NVIDIA H200", platform="gpu", num_cores=132)
    fn = jax.jit(lambda *a: chain_delta_rule(*a, implementation="pallas_triton"))
    with use_abstract_mesh(AbstractMesh((), (), abstract_device=h200)):
        hlo = fn.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    assert hlo.count("__gpu$xla.gpu.triton") == 2
    assert "triangular_solve" not in hlo and "stablehlo.while" not in hlo


# ---------------------------------------------------------------------------------------------- GPU

REAL = (arg_specs.REAL_HEADS, arg_specs.REAL_KEY_HEADS, arg_specs.REAL_DK, arg_specs.REAL_DV)


@on_gpu
@pytest.mark.parametrize("n,correlated", [(200, False), (1000, True)])
def test_gpu_chain_matches_recurrence(seed, n, correlated):
    """The compiled kernels (tf32x3 products between them) at the real heads against the fp32 recurrence."""
    args = chain_inputs(seed, n, REAL, batch=1, correlated=correlated)
    o, s = jax.jit(lambda *a: chain_delta_rule(*a, implementation="pallas_triton"))(*args)
    ro, rs = jax.jit(recurrence)(*args)
    assert rel_err(o, ro) < BOUND and rel_err(s, rs) < BOUND


@on_gpu
def test_gpu_state_pass_matches_scan(seed):
    """The state pass alone, compiled, at one layer's real heads over 16 blocks of 64, against the scan in fp32
    (HIGHEST)."""
    rng = np.random.default_rng(seed)
    b, nb, h, c, dk, dv = 1, 16, arg_specs.REAL_HEADS, 64, arg_specs.REAL_DK, arg_specs.REAL_DV
    f = lambda *shape: jnp.asarray(0.1 * rng.standard_normal(shape), jnp.float32)
    args = (f(b, nb, h, c, dk), f(b, nb, h, c, dk), f(b, nb, h, dk, c), f(b, nb, h, c, dv), f(b, nb, h, c, c),
            jnp.asarray(rng.uniform(0.5, 1.0, (b, nb, h)), jnp.float32), f(b, h, dk, dv))
    o, s = jax.jit(pallas_triton.state_pass)(*args)
    ro, rs = jax.jit(reference.state_pass)(*args)
    assert rel_err(o, ro) < BOUND and rel_err(s, rs) < BOUND
