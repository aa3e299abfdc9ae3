"""Rules of the pure-jnp references (pallas_kernels/*/reference.py, tree_delta_rule/xla.py) checked against
definitions written here in numpy: the RMSNorm epsilon, bf16 probabilities in attention, mixed-dtype conv inputs,
and finite gradients of the delta rule's jnp solvers under strong decay."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.add_rms_norm import api as add_norm_api, pallas_triton as add_norm_kernel
from pallas_kernels.add_rms_norm import reference as add_norm_ref
from pallas_kernels.chain_attention import reference as chain_ref
from pallas_kernels.gdn_tree_inputs import reference as tree_inputs_ref
from pallas_kernels.gdn_tree_inputs.arg_specs import make_inputs as tree_inputs_args, random_parents
from pallas_kernels.tree_attention import reference as tree_attn_ref
from pallas_kernels.tree_delta_rule import reference as delta_ref, xla as delta_xla
from pallas_kernels.verify import reference as verify_ref

BF16 = jnp.bfloat16


def to_bf16_f64(x):
    """float64 values rounded to bf16 (through fp32), back as float64."""
    return np.asarray(jnp.asarray(x, jnp.float32).astype(BF16).astype(jnp.float32), np.float64)


def f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def test_add_rms_norm_adds_eps_inside_the_root():
    """RMSNorm(s) = s / sqrt(mean(s^2) + eps) * (offset + w) = h * r, the reference's deferred outputs: rows whose
    mean square is of the order of eps (1e-3 scale) are normalised with eps inside the root, as the float64
    definition does."""
    rng = np.random.default_rng(11)
    for offset in (1.0, 0.0):
        x = rng.standard_normal((3, 4, 32)) * 1e-3
        u = rng.standard_normal((3, 4, 32)) * 1e-3
        w = rng.standard_normal(32) * 0.1
        s, h, r = add_norm_ref.add_rms_norm(jnp.asarray(x, jnp.float32), jnp.asarray(u, jnp.float32),
                                            jnp.asarray(w, jnp.float32), eps=1e-6, offset=offset)
        n = np.asarray(h, np.float64) * np.asarray(r, np.float64)
        sd = f64(jnp.asarray(x, jnp.float32)) + f64(jnp.asarray(u, jnp.float32))
        want = sd / np.sqrt(np.mean(sd * sd, -1, keepdims=True) + 1e-6) * (offset + f64(jnp.asarray(w, jnp.float32)))
        np.testing.assert_allclose(np.asarray(s, np.float64), sd, rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(n, want, rtol=1e-5, atol=1e-7)


def test_add_rms_norm_width_beyond_the_kernel_runs_the_reference(monkeypatch):
    """A row width the kernel would walk in more than its chunk limit (130 = 65 chunks of 2) runs the reference
    even when the kernel is asked for; a width it takes (128) runs the kernel."""
    rng = np.random.default_rng(17)
    calls = []
    monkeypatch.setattr(add_norm_kernel, "add_rms_norm", lambda *a, **kw: calls.append(a[0].shape))
    for d, kernel in ((130, False), (128, True)):
        assert add_norm_kernel.supports(d) == kernel
        x, u = (jnp.asarray(rng.standard_normal((2, 3, d)), jnp.float32) for _ in range(2))
        w = jnp.asarray(rng.standard_normal(d) * 0.1, jnp.float32)
        out = add_norm_api.add_rms_norm(x, u, w, eps=1e-6, offset=1.0, implementation="pallas_interpret")
        if kernel:
            assert calls == [x.shape]
        else:
            assert not calls
            want = add_norm_ref.add_rms_norm(x, u, w, eps=1e-6, offset=1.0)
            for a, b in zip(out, want):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_self_attention_rounds_probabilities_to_the_values_dtype():
    """chain_attention's self_attention on bf16 inputs: causal softmax of the scaled scores in fp32, the
    probabilities rounded to bf16 before the product with V (as the tree reference does), o in fp32, and lse the
    log-sum-exp of each row's scores; against a float64 loop that rounds the probabilities the same way."""
    rng = np.random.default_rng(12)
    b, n, h, kvh, hd = 2, 7, 4, 2, 16
    q, k, v = (jnp.asarray(rng.standard_normal(s), BF16) for s in ((b, n, h, hd), (b, n, kvh, hd), (b, n, kvh, hd)))
    o, lse = chain_ref.self_attention(q, k, v)
    qd, kd, vd = f64(q), f64(k), f64(v)
    want_o, want_lse = np.zeros((b, n, h, hd)), np.zeros((b, n, h))
    for bi in range(b):
        for i in range(n):
            for hh in range(h):
                s = kd[bi, :i + 1, hh // (h // kvh)] @ qd[bi, i, hh] / np.sqrt(hd)
                m = s.max()
                want_lse[bi, i, hh] = m + np.log(np.exp(s - m).sum())
                p = to_bf16_f64(np.exp(s - want_lse[bi, i, hh]))
                want_o[bi, i, hh] = p @ vd[bi, :i + 1, hh // (h // kvh)]
    assert o.dtype == jnp.float32 and lse.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(lse, np.float64), want_lse, rtol=1e-5, atol=1e-5)
    scale = np.abs(want_o).max()
    assert np.abs(np.asarray(o, np.float64) - want_o).max() < 2e-5 * scale


def test_tree_attention_rounds_probabilities_to_the_values_dtype():
    """tree_attention on bf16 inputs: each node's softmax over the prefix and its ancestors in fp32, probabilities
    rounded to bf16 before the product with V, output in bf16; equal to a float64 loop that rounds the same way on
    (nearly) every element."""
    rng = np.random.default_rng(13)
    b, n, h, kvh, hd, length = 2, 5, 4, 2, 16, 12
    q = jnp.asarray(rng.standard_normal((b, n, h, hd)), BF16)
    keys, values = (jnp.asarray(rng.standard_normal((b, length, kvh, hd)), BF16) for _ in range(2))
    start = np.array([3, 7])
    parent = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    anc = np.zeros((b, n, n), bool)
    for bi in range(b):
        for i in range(n):
            j = i
            while j >= 0:
                anc[bi, i, j], j = True, parent[j]
    got = tree_attn_ref.tree_attention(q, keys, values, jnp.asarray(start, jnp.int32), jnp.asarray(anc))
    qd, kd, vd = f64(q), f64(keys), f64(values)
    want = np.zeros((b, n, h, hd))
    for bi in range(b):
        for i in range(n):
            seen = [p for p in range(length) if p < start[bi] or (p - start[bi] < n and anc[bi, i, p - start[bi]])]
            for hh in range(h):
                s = kd[bi, seen, hh // (h // kvh)] @ qd[bi, i, hh] / np.sqrt(hd)
                p = np.exp(s - s.max())
                want[bi, i, hh] = to_bf16_f64(p / p.sum()) @ vd[bi, seen, hh // (h // kvh)]
    assert got.dtype == BF16
    equal = np.mean(f64(got) == to_bf16_f64(want))
    assert equal > 0.98, equal


def test_gdn_tree_inputs_bf16_history_with_fp32_nodes_is_exact():
    """A bf16 history joined to fp32 node inputs: the nodes' conv inputs keep their fp32 values (the join is in
    fp32), so the outputs equal those from the history cast to fp32 first."""
    parent = random_parents(14, 2, 6)
    y, history, conv_w, a_log, dt_bias, rows = tree_inputs_args(14, parent, 2, 2, 8, 8, 4)
    hist16 = history.astype(BF16)
    got = tree_inputs_ref.gdn_tree_inputs(y, hist16, conv_w, a_log, dt_bias, rows, dk=8, dv=8)
    want = tree_inputs_ref.gdn_tree_inputs(y, hist16.astype(jnp.float32), conv_w, a_log, dt_bias, rows, dk=8, dv=8)
    for name, a, w in zip(("q", "k", "v", "g", "beta"), got, want):
        assert a.dtype == jnp.float32, name
        np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=1e-6, atol=1e-7, err_msg=name)


def _strong_decay_chain(n=8, h=2, dk=8, dv=8):
    """A chain of n nodes with log-decay -20 per node: G reaches -20 n, and G_i - G_j for a later j (not an
    ancestor of i) is far beyond fp32's exp range."""
    rng = np.random.default_rng(15)
    l2 = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    q = l2(rng.standard_normal((1, n, h, dk))) * dk ** -0.5
    k = l2(rng.standard_normal((1, n, h, dk)))
    v = rng.standard_normal((1, n, h, dv))
    g = np.full((1, n, h), -20.0)
    beta = 1 / (1 + np.exp(-rng.standard_normal((1, n, h))))
    s0 = rng.standard_normal((1, h, dk, dv)) * 0.3
    anc = np.tril(np.ones((n, n), bool))[None]
    cast = lambda x: jnp.asarray(x, jnp.float32)
    return cast(q), cast(k), cast(v), cast(g), cast(beta), jnp.asarray(anc), cast(s0)


def test_tree_delta_rule_gradients_stay_finite_under_strong_decay():
    """The jnp solvers (reference and xla) are what a differentiated loss runs: their gradients with respect to
    every input stay finite when exp(G_i - G_j) off the ancestors would overflow, and are not all zero."""
    q, k, v, g, beta, anc, s0 = _strong_decay_chain()
    for fn in (delta_ref.tree_delta_rule, delta_xla.tree_delta_rule):
        def loss(q, k, v, g, beta, s0):
            o, delta, _ = fn(q, k, v, g, beta, anc, s0)
            return jnp.sum(o * o) + jnp.sum(delta)
        grads = jax.grad(loss, argnums=(0, 1, 2, 3, 4, 5))(q, k, v, g, beta, s0)
        for name, gr in zip(("q", "k", "v", "g", "beta", "s0"), grads):
            assert np.isfinite(np.asarray(gr)).all(), (fn.__module__, name)
            assert np.abs(np.asarray(gr)).max() > 0, (fn.__module__, name)


def test_block_factors_gradients_stay_finite_under_strong_decay():
    """block_factors (the chain form) differentiated on the same strongly decaying chain: finite gradients."""
    q, k, _, g, beta, _, _ = _strong_decay_chain()

    def loss(q, k, g, beta):
        tb, p, G = delta_ref.block_factors(q, k, g, beta)
        return jnp.sum(tb) + jnp.sum(p) + jnp.sum(G)
    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, g, beta)
    for name, gr in zip(("q", "k", "g", "beta"), grads):
        assert np.isfinite(np.asarray(gr)).all(), name


def test_gumbel_noise_depends_on_both_seed_words():
    """The hash noise of the sampling kernel reads both uint32 words of its seed: changing either word alone
    changes (nearly) every element's noise, and the same seed gives the same noise."""
    rng = np.random.default_rng(16)
    w0, w1 = (int(x) for x in rng.integers(0, 2 ** 32, 2, dtype=np.uint64))
    rows = jnp.arange(4, dtype=jnp.uint32)[:, None]
    cols = jnp.arange(64, dtype=jnp.uint32)[None, :]
    noise = lambda a, b: np.asarray(verify_ref.gumbel(jnp.asarray([a, b], jnp.uint32), rows, cols))
    base = noise(w0, w1)
    assert np.isfinite(base).all()
    np.testing.assert_array_equal(noise(w0, w1), base)
    for other in (noise(w0 ^ 1, w1), noise(w0, w1 ^ 1), noise(w0, w1 ^ 0x80000000)):
        assert np.mean(other != base) > 0.9
