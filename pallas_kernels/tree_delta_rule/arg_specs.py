"""Argument specs shared by the tests and the benchmark: shapes, tree shapes and random inputs.

Inputs follow the model's statistics (jaxspec/model.py GatedDeltaNet): q and k l2-normalised, q scaled
by Dk^-1/2, g = -softplus(.) < 0, beta = sigmoid(.), and a nonzero entering state.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

REAL_HEADS, REAL_DK, REAL_DV = 48, 128, 128   # Qwen3.6-27B GDN: value heads, key and value head dims
REAL_KEY_HEADS = 16                           # each serving 3 value heads
VERIFY_SIZES = (1, 16, 65)                    # AR step, DFlash chain, DDTree(64) + root
CHUNK_SIZE = 64                               # a prefill chunk (jaxspec/model.py CHUNK)


@dataclasses.dataclass(frozen=True)
class Spec:
    batch: int
    n: int
    heads: int
    dk: int
    dv: int
    shape: str = "tree"       # "chain" | "tree" | "ragged" (real nodes then inert padding, per sequence)
    correlated: bool = False  # nearly parallel keys, weak decay, strong writes: the ill-conditioned case
    log_decay: float | None = None  # a constant g instead of a random one (strong-decay tests)
    key_heads: int | None = None    # q and k heads, each serving heads / key_heads value heads (default: heads)


def parents(rng: np.random.Generator, spec: Spec) -> np.ndarray:
    """[B, N] parent indices in a topological order, -1 at the root."""
    b, n = spec.batch, spec.n
    if spec.shape == "chain":
        return np.broadcast_to(np.arange(n) - 1, (b, n)).copy()
    return np.stack([np.array([-1] + [rng.integers(0, i) for i in range(1, n)]) for _ in range(b)])


def ancestors(parent: np.ndarray) -> np.ndarray:
    """[B, N, N] bool ancestor-or-self mask of parents [B, N]."""
    b, n = parent.shape
    anc = np.zeros((b, n, n), bool)
    for bi in range(b):
        for i in range(n):
            j = i
            while j >= 0:
                anc[bi, i, j] = True
                j = parent[bi, j]
    return anc


def real_nodes(rng: np.random.Generator, spec: Spec) -> np.ndarray:
    """[B] number of real nodes; the rest of a "ragged" sequence is padding."""
    if spec.shape != "ragged":
        return np.full(spec.batch, spec.n)
    return np.concatenate([[spec.n], rng.integers(1, spec.n + 1, spec.batch - 1)])


def make_inputs(seed: int, spec: Spec):
    """(q, k, v, g, beta, anc, s0) as fp32 / bool jax arrays, plus the parents [B, N] (numpy).

    Ragged padding nodes are what the model's chain padding is: zero q, k, v, g and beta; here they
    hang off random real nodes, so they carry ancestors but change nothing.
    """
    rng = np.random.default_rng(seed)
    b, n, h, dk, dv = spec.batch, spec.n, spec.heads, spec.dk, spec.dv
    hk = spec.key_heads or h
    l2 = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    if spec.correlated:
        k = rng.standard_normal((b, 1, hk, dk)) + 0.2 * rng.standard_normal((b, n, hk, dk))
        g = -0.01 * np.abs(rng.standard_normal((b, n, h)))
        beta = 0.9 + 0.1 * rng.random((b, n, h))
    else:
        k = rng.standard_normal((b, n, hk, dk))
        g = -np.logaddexp(0.0, rng.standard_normal((b, n, h)))
        beta = 1 / (1 + np.exp(-rng.standard_normal((b, n, h))))
    if spec.log_decay is not None:
        g = np.full((b, n, h), spec.log_decay)
    k = l2(k)
    q = l2(rng.standard_normal((b, n, hk, dk))) * dk ** -0.5
    v = rng.standard_normal((b, n, h, dv))
    s0 = 0.3 * rng.standard_normal((b, h, dk, dv))
    parent = parents(rng, spec)
    real = real_nodes(rng, spec)
    for bi, m in enumerate(real):
        parent[bi, m:] = [rng.integers(0, i) for i in range(m, n)]
        for x in (q, k, v, g, beta):
            x[bi, m:] = 0.0
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return (f32(q), f32(k), f32(v), f32(g), f32(beta), jnp.asarray(ancestors(parent)), f32(s0)), parent


def recurrence64(args, parent):
    """The definition, in float64 numpy: each node's state from its parent's, S = e^g S_parent +
    k d^T, d = beta (v - S^T k), o = S^T q. Returns o, delta [B, N, H, Dv] and the states after each
    node [B, N, H, Dk, Dv]. (Independent of every implementation's algebra: the accuracy oracle.)"""
    q, k, v, g, beta, _, s0 = (np.asarray(x, np.float64) for x in args)
    q, k = (np.repeat(x, v.shape[2] // x.shape[2], 2) for x in (q, k))
    b, n = parent.shape
    o, delta = np.zeros(v.shape), np.zeros(v.shape)
    states = np.zeros((b, n) + s0.shape[1:])
    for bi in range(b):
        state = {}
        for i in range(n):
            p = parent[bi, i]
            s = np.exp(g[bi, i])[:, None, None] * (s0[bi] if p < 0 else state[p])
            d = beta[bi, i][:, None] * (v[bi, i] - np.einsum("hk,hkv->hv", k[bi, i], s))
            state[i] = states[bi, i] = s + np.einsum("hk,hv->hkv", k[bi, i], d)
            delta[bi, i] = d
            o[bi, i] = np.einsum("hk,hkv->hv", q[bi, i], state[i])
    return o, delta, states
