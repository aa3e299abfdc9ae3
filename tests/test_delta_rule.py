"""The tree delta rule reference against the token-by-token recurrence."""

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.tree_delta_rule.reference import recurrent_reference, state_at, tree_delta_rule


def _inputs(rng, b, n, h, dk, dv):
    k = jax.random.split(rng, 6)
    l2 = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    q = l2(jax.random.normal(k[0], (b, n, h, dk))) * dk ** -0.5
    kk = l2(jax.random.normal(k[1], (b, n, h, dk)))
    v = jax.random.normal(k[2], (b, n, h, dv))
    g = -jax.nn.softplus(jax.random.normal(k[3], (b, n, h)))
    beta = jax.nn.sigmoid(jax.random.normal(k[4], (b, n, h)))
    s0 = jax.random.normal(k[5], (b, h, dk, dv)) * 0.3
    return q, kk, v, g, beta, s0


def test_chain_block_equals_recurrence():
    q, k, v, g, beta, s0 = _inputs(jax.random.key(0), 2, 37, 3, 8, 5)
    anc = jnp.broadcast_to(jnp.tril(jnp.ones((37, 37), bool)), (2, 37, 37))
    o, delta, G = tree_delta_rule(q, k, v, g, beta, anc, s0)
    o_ref, s_ref = recurrent_reference(q, k, v, g, beta, s0)
    np.testing.assert_allclose(o, o_ref, rtol=1e-4, atol=1e-5)
    s = state_at(s0, k, delta, G, jnp.ones((2, 37), bool), G[:, -1])
    np.testing.assert_allclose(s, s_ref, rtol=1e-4, atol=1e-5)


def test_tree_nodes_equal_path_recurrence():
    rng = np.random.RandomState(0)
    n = 20
    parent = np.array([-1] + [rng.randint(0, i) for i in range(1, n)])
    anc = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = parent[j]
    q, k, v, g, beta, s0 = _inputs(jax.random.key(1), 1, n, 2, 6, 4)
    o, delta, G = tree_delta_rule(q, k, v, g, beta, jnp.asarray(anc[None]), s0)
    for i in range(n):
        path = np.flatnonzero(anc[i])
        o_ref, s_ref = recurrent_reference(*(x[:, path] for x in (q, k, v, g, beta)), s0)
        np.testing.assert_allclose(o[:, i], o_ref[:, -1], rtol=1e-4, atol=1e-5)
        s = state_at(s0, k, delta, G, jnp.asarray(anc[i][None]), G[:, i])
        np.testing.assert_allclose(s, s_ref, rtol=1e-4, atol=1e-5)


def test_states_at_equals_state_at_per_layer():
    """The commit's batched form: several layers after one node, key heads shared by `rep` value heads."""
    from pallas_kernels.tree_delta_rule.reference import states_at
    rng = np.random.default_rng(3)
    b, n, hk, rep, dk, dv, layers = 2, 9, 2, 3, 5, 4, 3
    h = hk * rep
    anc_row = jnp.asarray(rng.random((b, n)) < 0.6)
    s0s = [jnp.asarray(rng.normal(size=(b, h, dk, dv)), jnp.float32) for _ in range(layers)]
    ks = [jnp.asarray(rng.normal(size=(b, n, hk, dk)), jnp.float32) for _ in range(layers)]
    deltas = [jnp.asarray(rng.normal(size=(b, n, h, dv)), jnp.float32) for _ in range(layers)]
    Gs = [jnp.asarray(-np.cumsum(rng.random((b, n, h)), 1), jnp.float32) for _ in range(layers)]
    G_nodes = [G[:, 5] for G in Gs]
    got = states_at(s0s, ks, deltas, Gs, anc_row, G_nodes)
    assert len(got) == layers
    for l in range(layers):
        want = state_at(s0s[l], jnp.repeat(ks[l], rep, 2), deltas[l], Gs[l], anc_row, G_nodes[l])
        np.testing.assert_allclose(got[l], want, rtol=1e-5, atol=1e-6)
        assert not np.allclose(got[l], s0s[l])            # the update is not empty


def test_states_at_over_listed_nodes_equals_masked():
    """`nodes`: contracting over a listed subset of the nodes (an accepted path, padded past its length) equals
    contracting over all N with the others masked out, per sequence."""
    from pallas_kernels.tree_delta_rule.reference import states_at
    rng = np.random.default_rng(4)
    b, n, hk, rep, dk, dv, layers, p = 2, 11, 2, 2, 4, 3, 3, 5
    h = hk * rep
    nodes = np.stack([rng.permutation(n)[:p] for _ in range(b)]).astype(np.int32)
    length = np.array([3, 5])
    on = np.arange(p)[None] < length[:, None]
    anc_row = np.zeros((b, n), bool)
    for i in range(b):
        anc_row[i, nodes[i, :length[i]]] = True
    s0s = [jnp.asarray(rng.normal(size=(b, h, dk, dv)), jnp.float32) for _ in range(layers)]
    ks = [jnp.asarray(rng.normal(size=(b, n, hk, dk)), jnp.float32) for _ in range(layers)]
    deltas = [jnp.asarray(rng.normal(size=(b, n, h, dv)), jnp.float32) for _ in range(layers)]
    Gs = [jnp.asarray(-np.cumsum(rng.random((b, n, h)), 1), jnp.float32) for _ in range(layers)]
    G_nodes = [G[:, 7] for G in Gs]
    want = states_at(s0s, ks, deltas, Gs, jnp.asarray(anc_row), G_nodes)
    got = states_at(s0s, ks, deltas, Gs, jnp.asarray(on), G_nodes, nodes=jnp.asarray(nodes))
    for g, w, s0 in zip(got, want, s0s):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        assert not np.allclose(g, s0)
