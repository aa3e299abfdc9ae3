"""Pure-jnp reference of the tree delta rule: the spec and the test oracle for its kernels.

Per value head, with A the ancestor-or-self mask of a block of N nodes in topological order
(so A is lower-triangular), G = A g and D_ij = exp(G_i - G_j) A_ij:

    (I + diag(beta) (strict(D) * K K^T)) Delta = diag(beta) (V - diag(e^G) K S0)
    O   = diag(e^G) Q S0 + (D * Q K^T) Delta
    S_a = e^{G_a} S0 + sum_{j in anc*(a)} e^{G_a - G_j} k_j Delta_j^T

Delta_j is the true per-token delta of the recurrence S_t = e^{g_t} S_{t-1} + k_t Delta_t^T, so no
per-node state is ever stored: the state of any node is rebuilt from (S0, k, Delta, G).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.gdn_commit.reference import gdn_commit

_HI = jax.lax.Precision.HIGHEST


def _decay(G, anc):
    """D_ij = exp(G_i - G_j) on ancestors, 0 elsewhere. [B,H,N,N].

    exp(G_i - G_j) is formed from the difference, never as exp(G_i) * exp(-G_j): G is a sum of
    negative log-decays and exp(-G_j) overflows fp32 on long paths.
    """
    diff = G[..., :, None] - G[..., None, :]
    return jnp.where(anc[:, None], jnp.exp(jnp.where(anc[:, None], diff, 0.0)), 0.0)


def heads_per_key(q, k, v) -> int:
    """How many value heads each key head serves: q and k [B, N, Hk, Dk] (equal shapes), v [B, N, H, Dv]
    with H a multiple of Hk; value head h reads key head h // (H / Hk) (the GDN's repeat_interleave)."""
    if q.ndim != 4 or v.ndim != 4 or q.shape != k.shape or q.shape[:2] != v.shape[:2] or not q.shape[2] or (
            v.shape[2] % q.shape[2]):
        raise ValueError(f"tree_delta_rule: q {q.shape} and k {k.shape} must be equal [B, N, Hk, Dk] with Hk "
                         f"dividing the value heads of v {v.shape} [B, N, H, Dv]")
    return v.shape[2] // q.shape[2]


def check_args(q, k, v, g, beta, anc, s0) -> int:
    """`heads_per_key`, after checking the other arguments against q [B, N, Hk, Dk] and v [B, N, H, Dv]: g, beta
    [B, N, H], anc [B, N, N] bool (or integer), s0 [B, H, Dk, Dv]. Static shapes, so a Python check (also under
    jit); a mismatch is refused naming the argument. The kernels read wrong shapes out of bounds (NaN or garbage)."""
    rep = heads_per_key(q, k, v)
    b, n, h, dv = v.shape
    want = dict(g=("[B, N, H]", (b, n, h)), beta=("[B, N, H]", (b, n, h)), anc=("[B, N, N]", (b, n, n)),
                s0=("[B, H, Dk, Dv]", (b, h, q.shape[3], dv)))
    for (name, (dims, shape)), x in zip(want.items(), (g, beta, anc, s0)):
        if x.shape != shape:
            raise ValueError(f"tree_delta_rule: {name} {x.shape} must be {dims} = {shape} for q {q.shape} and "
                             f"v {v.shape}")
    if not (anc.dtype == jnp.bool_ or jnp.issubdtype(anc.dtype, jnp.integer)):
        raise ValueError(f"tree_delta_rule: anc {anc.shape} {anc.dtype} must be bool (or integer 0 / 1): the "
                         f"kernels threshold it, the jnp solvers weight by it")
    return rep


def tree_delta_rule(q, k, v, g, beta, anc, s0):
    """One block of the gated delta rule on a tree.

    q, k: [B, N, Hk, Dk] fp32 (q already scaled, both l2-normalised), each key head serving H / Hk value
          heads (value head h reads key head h // (H / Hk)); Hk = H for one key head per value head
    v:    [B, N, H, Dv] fp32
    g, beta: [B, N, H] fp32 (log-decay, write strength)
    anc:  [B, N, N] bool, anc[b, i, j] = j is an ancestor-or-self of i
    s0:   [B, H, Dk, Dv] fp32 state entering the block
    Returns o [B,N,H,Dv], delta [B,N,H,Dv], G [B,N,H] (path-cumulative log-decay).
    """
    f32 = jnp.float32
    rep = check_args(q, k, v, g, beta, anc, s0)
    q, k = (jnp.repeat(x, rep, 2) for x in (q, k))
    q, k, v, g, beta, s0 = (x.astype(f32) for x in (q, k, v, g, beta, s0))
    n = q.shape[1]
    G = jnp.einsum("bij,bjh->bih", anc.astype(f32), g, precision=_HI)
    D = _decay(jnp.moveaxis(G, -1, 1), anc)                                  # [B,H,N,N]
    eG = jnp.exp(G)                                                            # [B,N,H]
    kk = jnp.einsum("bihd,bjhd->bhij", k, k, precision=_HI)
    strict = ~jnp.eye(n, dtype=bool)
    lhs = jnp.eye(n, dtype=f32) + jnp.moveaxis(beta, 1, -1)[..., :, None] * jnp.where(strict, D * kk, 0.0)
    ks0 = jnp.einsum("bnhk,bhkv->bnhv", k, s0, precision=_HI)
    rhs = beta[..., None] * (v - eG[..., None] * ks0)                          # [B,N,H,Dv]
    delta = jax.scipy.linalg.solve_triangular(lhs, jnp.moveaxis(rhs, 1, 2), lower=True, unit_diagonal=True)
    delta = jnp.moveaxis(delta, 2, 1)                                          # [B,N,H,Dv]
    qk = jnp.einsum("bihd,bjhd->bhij", q, k, precision=_HI)
    o = eG[..., None] * jnp.einsum("bnhk,bhkv->bnhv", q, s0, precision=_HI)
    o = o + jnp.einsum("bhij,bjhv->bihv", D * qk, delta, precision=_HI)
    return o, delta, G


def state_at(s0, k, delta, G, anc_row, G_node):
    """State after node a: e^{G_a} S0 + sum_j anc_row_j e^{G_a - G_j} k_j Delta_j^T.

    s0 [B,H,Dk,Dv]; k [B,N,Hk,Dk] (each key head serving H / Hk value heads); delta [B,N,H,Dv]; G [B,N,H];
    anc_row [B,N] bool (ancestors of a); G_node [B,H] = G_a.
    """
    return states_at([s0], [k], [delta], [G], anc_row, [G_node])[0]


def path_terms(ks, deltas, Gs, anc_row, G_nodes, nodes=None):
    """The terms of `state_at`'s sum for several layers at once, all after the same node a (one accepted path,
    anc_row [B,N]), from lists of per-layer k [B,N,Hk,Dk], delta [B,N,H,Dv], G [B,N,H] and G_node [B,H]:
    w [L,B,N,H] = anc_row e^{G_a - G} (0 off the path), k [L,B,N,Hk,Dk], delta [L,B,N,H,Dv] and e^{G_a} [L,B,H],
    what pallas_kernels/gdn_commit folds into every layer's state.

    nodes [B,P] (optional): these nodes only, anc_row [B,P] then marking which of them count (an accepted path of
    at most P nodes in a tree of N > P: a DDTree of 64 nodes drafted 15 deep has paths of at most 16 nodes, so
    the update's product shrinks from 65 terms to 16)."""
    G, G_node = jnp.stack(Gs), jnp.stack(G_nodes)                                   # [L,B,N,H], [L,B,H]
    k, delta = jnp.stack(ks), jnp.stack(deltas)
    if nodes is not None:
        take = lambda x: jnp.take_along_axis(x, nodes.reshape((1,) + nodes.shape + (1,) * (x.ndim - 3)), 2)
        G, k, delta = take(G), take(k), take(delta)
    a = anc_row[None, ..., None]
    w = jnp.where(a, jnp.exp(jnp.where(a, G_node[:, :, None] - G, 0.0)), 0.0)
    return w, k, delta, jnp.exp(G_node)


def states_at(s0s, ks, deltas, Gs, anc_row, G_nodes, nodes=None):
    """`state_at` for several layers at once, all after the same node a: lists of per-layer s0 [B,H,Dk,Dv] and
    `path_terms`' arguments. The updates of all layers are one contraction (gdn_commit's reference): one layer's
    is a tiny product (the real shape: 48 heads of 128 x 128 from at most 65 nodes), and as 48 separate ones
    they took 0.47 ms of a commit's 0.88 ms on the H200 at ~0.65 TB/s
    (bench/results/2026-11-30-h200-verify-profile/h-8d1c1e2/commit65.log)."""
    keep = jnp.ones(s0s[0].shape[:1], bool)
    return list(gdn_commit(s0s, *path_terms(ks, deltas, Gs, anc_row, G_nodes, nodes), keep))


def recurrent_reference(q, k, v, g, beta, s0):
    """Token-by-token recurrence on a chain (the definition; used only by tests)."""
    def step(s, x):
        qt, kt, vt, gt, bt = x
        s = jnp.exp(gt)[..., None, None] * s
        d = bt[..., None] * (vt - jnp.einsum("bhk,bhkv->bhv", kt, s, precision=_HI))
        s = s + jnp.einsum("bhk,bhv->bhkv", kt, d, precision=_HI)
        return s, jnp.einsum("bhk,bhkv->bhv", qt, s, precision=_HI)
    xs = tuple(jnp.moveaxis(x.astype(jnp.float32), 1, 0) for x in (q, k, v, g, beta))
    s, o = jax.lax.scan(step, s0.astype(jnp.float32), xs)
    return jnp.moveaxis(o, 0, 1), s


# ---------------------------------------------------------------------------------------------- chains (prefill)

def block_factors(q, k, g, beta, *, inverse=None):
    """What a block of a chain contributes whatever state enters it: q, k [B, C, Hk, Dk], g, beta [B, C, H].
    With D as in the module docstring, A = diag(beta) (strict(D) * K K^T) and E = diag(e^G):

        Tb = (I + A)^-1 diag(beta)    P = D * Q K^T    [B, H, C, C];    G [B, C, H] the cumulative log-decay

    (P lower-triangular with its diagonal, Tb lower-triangular) so that, for a block entered at S0,
    Delta = Tb (V - E K S0) and O = E Q S0 + P Delta.
    inverse: (I + L)^-1 for strictly lower L [..., C, C] (default: a triangular solve)."""
    f32 = jnp.float32
    q, k = (jnp.repeat(x.astype(f32), g.shape[2] // q.shape[2], 2) for x in (q, k))
    g, beta = g.astype(f32), beta.astype(f32)
    b, c = q.shape[:2]
    low = jnp.broadcast_to(jnp.tril(jnp.ones((c, c), bool)), (b, c, c))
    G = jnp.cumsum(g, axis=1)
    D = _decay(jnp.moveaxis(G, -1, 1), low)                                    # [B,H,C,C]
    kk = jnp.einsum("bihd,bjhd->bhij", k, k, precision=_HI)
    qk = jnp.einsum("bihd,bjhd->bhij", q, k, precision=_HI)
    beta_h = jnp.moveaxis(beta, 1, -1)                                         # [B,H,C]
    L = beta_h[..., :, None] * jnp.where(~jnp.eye(c, dtype=bool), D * kk, 0.0)
    if inverse is None:
        eye = jnp.broadcast_to(jnp.eye(c, dtype=f32), L.shape)
        inv = jax.scipy.linalg.solve_triangular(eye + L, eye, lower=True, unit_diagonal=True)
    else:
        inv = inverse(L)
    return inv * beta_h[..., None, :], D * qk, G


def state_pass(w, eq, kdt, tbv, p, gl, s0):
    """The serial part of a chain in blocks, block by block from s0 [B, H, Dk, Dv]: with the block's
    W = Tb E K and E Q ([B, NB, H, C, Dk]), Kd^T = (e^{G_last - G} K)^T ([B, NB, H, Dk, C]), Tb V ([B, NB, H, C,
    Dv]), P ([B, NB, H, C, C], `block_factors`) and gl = e^{G_last} [B, NB, H]:

        Delta = Tb V - W S    O = E Q S + P Delta    S <- gl S + Kd^T Delta

    Returns O [B, NB, H, C, Dv] and the state after the last block."""
    def block(s, x):
        w, eq, kdt, tbv, p, gl = x
        delta = tbv - jnp.einsum("bhck,bhkv->bhcv", w, s, precision=_HI)
        o = jnp.einsum("bhck,bhkv->bhcv", eq, s, precision=_HI) + jnp.einsum("bhij,bhjv->bhiv", p, delta,
                                                                              precision=_HI)
        return gl[..., None, None] * s + jnp.einsum("bhkc,bhcv->bhkv", kdt, delta, precision=_HI), o

    xs = tuple(jnp.moveaxis(x.astype(jnp.float32), 1, 0) for x in (w, eq, kdt, tbv, p, gl))
    s, o = jax.lax.scan(block, s0.astype(jnp.float32), xs)
    return jnp.moveaxis(o, 0, 1), s
