"""What the GDN kernels' bodies and the accepted-path walk promise at the edges of their inputs.

The GDN gate g = -exp(A_log) softplus(a + dt_bias) is computed in the overflow-free form in both kernels
(pallas_kernels/gdn_decode and gdn_tree_inputs, interpret mode): a gate input far past exp's fp32 range (a + dt_bias
of 100 to 400) still gives the reference's finite log-decay, not -inf. The decode step's gated RMSNorm uses the eps
it is given (the model passes cfg.rms_norm_eps), not a fixed one. The l2 norms of q and k add their 1e-6 as the
reference does, which decides the result when a node's conv outputs are tiny. And the engine's accepted path starts
at node 0 and only ever follows its descendants: another root whose token is the target's choice is never walked
into (trees.forest: only node 0 can be on an accepted path).

Errors are max |x - ref| / max |ref| per output, as in the kernels' own test files.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec import tree as trees
from jaxspec.engine import accept
from pallas_kernels.gdn_decode import pallas_triton as decode_kernel
from pallas_kernels.gdn_decode import reference as decode_reference
from pallas_kernels.gdn_decode.arg_specs import make_inputs as decode_inputs
from pallas_kernels.gdn_tree_inputs import pallas_triton as tree_inputs_kernel
from pallas_kernels.gdn_tree_inputs import reference as tree_inputs_reference
from pallas_kernels.gdn_tree_inputs.arg_specs import make_inputs as tree_inputs, random_parents

DECODE_NAMES = ("out", "k", "delta", "G")
TREE_NAMES = ("q", "k", "v", "g", "beta")


def rel_err(x, ref):
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(x - ref).max() / np.abs(ref).max())


def assert_matches(names, out, ref, bound):
    for name, x, r in zip(names, out, ref):
        assert x.shape == r.shape, (name, x.shape, r.shape)
        assert np.isfinite(np.asarray(x, np.float32)).all(), name
        err = rel_err(x, r)
        assert err < bound, f"{name}: relative error {err:.2e} >= {bound:.0e}"


# ---------------------------------------------------------------------------------------------- GDN gate


def test_decode_gate_past_exps_range_is_the_references(seed):
    """a + dt_bias from 100 to 400 on half the value heads, with exp(A_log) ~ 2e-3 so that their decay stays well
    away from 0 (e^g ~ 0.45 .. 0.8): the kernel's G, Delta and output are the reference's, all finite."""
    hk, rep = 2, 2
    conv_in, history, conv_w, z, a, b, a_log, dt_bias, norm_w, s0 = decode_inputs(seed, 2, hk, rep, 16, 16, 4)
    rng = np.random.default_rng(seed)
    big = jnp.asarray(rng.uniform(100.0, 400.0, (2, hk * rep)), jnp.float32)
    hot = jnp.arange(hk * rep) % 2 == 0
    a = jnp.where(hot, big - dt_bias, a)
    a_log = jnp.where(hot, np.log(2e-3), a_log)
    args = (conv_in, history, conv_w, z, a, b, a_log, dt_bias, norm_w, s0)
    ref = decode_reference.gdn_decode(*args, eps=1e-6)
    decay = np.exp(np.asarray(ref[3]))[:, np.asarray(hot)]
    assert (decay > 0.4).all() and (decay < 0.9).all(), decay
    assert_matches(DECODE_NAMES, decode_kernel.gdn_decode(*args, eps=1e-6, interpret=True), ref, 1e-4)


def test_tree_inputs_gate_past_exps_range_is_the_references(seed):
    """The same gate inputs through the tree inputs kernel (its a columns of the in_proj product set to 100 .. 400
    minus dt_bias on half the value heads): g is the reference's, finite, e^g well away from 0."""
    hk, rep, dk, dv = 2, 2, 16, 16
    parent = random_parents(seed, 2, 9)
    y, history, conv_w, a_log, dt_bias, rows = tree_inputs(seed, parent, hk=hk, rep=rep, dk=dk, dv=dv, kw=4)
    gc, gw = 2 * dk + rep * dv, y.shape[-1] // hk
    rng = np.random.default_rng(seed)
    hot = np.arange(hk * rep) % 2 == 0
    for h in np.nonzero(hot)[0]:
        col = (h // rep) * gw + gc + rep * dv + rep + h % rep                 # head h's `a` column
        y = y.at[:, :, col].set(jnp.asarray(rng.uniform(100.0, 400.0, y.shape[:2]), jnp.float32) - dt_bias[h])
    a_log = jnp.where(jnp.asarray(hot), np.log(2e-3), a_log)
    args = (y, history, conv_w, a_log, dt_bias, rows)
    ref = tree_inputs_reference.gdn_tree_inputs(*args, dk=dk, dv=dv)
    decay = np.exp(np.asarray(ref[3]))[..., hot]
    assert (decay > 0.4).all() and (decay < 0.9).all(), decay
    assert_matches(TREE_NAMES, tree_inputs_kernel.gdn_tree_inputs(*args, dk=dk, dv=dv, interpret=True), ref, 1e-5)


# ---------------------------------------------------------------------------------------------- norms' eps


def test_decode_norm_uses_the_eps_it_is_given(seed):
    """eps = 0.05, of the order of mean(o^2) here: the kernel's output is the reference's at that eps, and far from
    what eps = 1e-6 gives (so a kernel that ignored the argument would be seen)."""
    args = decode_inputs(seed, 2, 2, 2, 16, 16, 4)
    out = decode_kernel.gdn_decode(*args, eps=0.05, interpret=True)
    assert_matches(DECODE_NAMES, out, decode_reference.gdn_decode(*args, eps=0.05), 1e-4)
    assert rel_err(out[0], decode_reference.gdn_decode(*args, eps=1e-6)[0]) > 0.1


def test_tree_inputs_l2_norm_eps_on_tiny_conv_outputs(seed):
    """In_proj outputs and history scaled by 3e-4: |x_q|^2 and |x_k|^2 are near the l2 norms' 1e-6, which then shrinks q
    and k well below unit length (q by a further Dk^-1/2); the kernel's q and k are still the reference's."""
    dk, dv = 16, 16
    parent = random_parents(seed, 2, 20)
    y, history, conv_w, a_log, dt_bias, rows = tree_inputs(seed, parent, hk=2, rep=2, dk=dk, dv=dv, kw=4)
    args = (3e-4 * y, 3e-4 * history, conv_w, a_log, dt_bias, rows)
    ref = tree_inputs_reference.gdn_tree_inputs(*args, dk=dk, dv=dv)
    k_len = np.linalg.norm(np.asarray(ref[1]), axis=-1)
    assert k_len.max() < 0.9 and np.median(k_len) < 0.8, k_len               # the eps is not negligible
    assert_matches(TREE_NAMES, tree_inputs_kernel.gdn_tree_inputs(*args, dk=dk, dv=dv, interpret=True), ref, 1e-5)


def test_decode_l2_norm_eps_on_tiny_conv_outputs(seed):
    """The decode step's l2 norms on a token whose conv inputs and history are scaled by 3e-4: its k (shrunk by the
    eps well below unit length) and everything after it are the reference's."""
    conv_in, history, *rest = decode_inputs(seed, 2, 2, 2, 16, 16, 4)
    args = (3e-4 * conv_in, 3e-4 * history, *rest)
    ref = decode_reference.gdn_decode(*args, eps=1e-6)
    k_len = np.linalg.norm(np.asarray(ref[1]), axis=-1)
    assert k_len.max() < 0.9 and np.median(k_len) < 0.8, k_len
    assert_matches(DECODE_NAMES, decode_kernel.gdn_decode(*args, eps=1e-6, interpret=True), ref, 1e-4)


# ---------------------------------------------------------------------------------------------- accepted path


@pytest.mark.parametrize("shape", ["forest", "two trees"])
def test_accept_never_walks_into_another_root(seed, shape):
    """Node 0's token is not the target's choice at it, another root's is: the path is node 0 alone and the bonus the
    target's choice at node 0, in a forest (n roots) and in two trees side by side (a second root at node 3 with a
    child whose token is the choice at that root)."""
    rng = np.random.default_rng(seed)
    choice = rng.integers(0, 50, (2, 6)).astype(np.int32)
    tokens = rng.integers(100, 150, (2, 6)).astype(np.int32)                       # none is any node's choice
    if shape == "forest":
        tree = trees.forest(2, 6)
    else:
        tree = trees.from_parents(jnp.asarray([[-1, 0, 1, -1, 3, 3]] * 2, jnp.int32))
        tokens[:, 4] = choice[:, 3]
    tokens[:, 3] = choice[:, 0]                                                     # the other root: the root's choice
    path, n, bonus = accept(tree, jnp.asarray(tokens), jnp.asarray(choice))
    assert n.tolist() == [1, 1] and path[:, 0].tolist() == [0, 0]
    assert bonus.tolist() == choice[:, 0].tolist()
