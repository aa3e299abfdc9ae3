"""Argument specs shared by the tests and the benchmark: shapes, random trees and random inputs."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

REAL_HEADS, REAL_KV_HEADS, REAL_HEAD_DIM = 24, 4, 256   # Qwen3.6-27B full attention
VERIFY_SIZES = (1, 16, 65)                              # AR step, DFlash chain, DDTree(64) + root
PREFIXES = (1024, 32768, 131072)


@dataclasses.dataclass(frozen=True)
class Spec:
    batch: int
    n: int                       # tree nodes
    prefix: int                  # longest committed prefix in the batch
    heads: int = REAL_HEADS
    kv_heads: int = REAL_KV_HEADS
    head_dim: int = REAL_HEAD_DIM
    shape: str = "tree"          # "tree" (random parents before children) | "chain"
    ragged: bool = True          # other sequences get random shorter prefixes
    slack: int = 37              # cache slots past start + N (the cache is longer than what is read)
    dtype: str = "float32"

    @property
    def length(self) -> int:
        return self.prefix + self.n + self.slack


def parents(rng: np.random.Generator, spec: Spec) -> np.ndarray:
    """[B, N] parent indices in a topological order, -1 at the root."""
    b, n = spec.batch, spec.n
    if spec.shape == "chain":
        return np.broadcast_to(np.arange(n) - 1, (b, n)).copy()
    return np.stack([np.concatenate([[-1], (rng.random(n - 1) * np.arange(1, n)).astype(np.int64)])
                     for _ in range(b)])


def ancestors(parent: np.ndarray) -> np.ndarray:
    """[B, N, N] bool ancestor-or-self mask (parents come before children, so one pass suffices)."""
    b, n = parent.shape
    anc = np.zeros((b, n, n), bool)
    anc[:, np.arange(n), np.arange(n)] = True
    for bi in range(b):
        for i in range(1, n):
            anc[bi, i] |= anc[bi, parent[bi, i]]
    return anc


def starts(rng: np.random.Generator, spec: Spec) -> np.ndarray:
    if not spec.ragged:
        return np.full(spec.batch, spec.prefix, np.int32)
    return np.concatenate([[spec.prefix], rng.integers(0, spec.prefix + 1, spec.batch - 1)]).astype(np.int32)


def make_inputs(seed: int, spec: Spec):
    """(q, keys, values, start, anc) as jax arrays of spec.dtype (start int32, anc bool)."""
    rng = np.random.default_rng(seed)
    b, n, h, kv, hd, L = spec.batch, spec.n, spec.heads, spec.kv_heads, spec.head_dim, spec.length
    dt = jnp.dtype(spec.dtype)
    # Drawn on the device (the long-prefix caches are GBs). Keys with a per-channel offset and queries
    # of the scale a q/k-normed model gives: a peaked softmax that also sees a spread of keys.
    kq, kk, kv_, ko = jax.random.split(jax.random.key(seed), 4)
    q = (1.5 * jax.random.normal(kq, (b, n, h, hd), jnp.float32)).astype(dt)
    offset = 0.5 * jax.random.normal(ko, (hd,), jnp.float32)
    keys = (jax.random.normal(kk, (b, L, kv, hd), jnp.float32) + offset).astype(dt)
    values = jax.random.normal(kv_, (b, L, kv, hd), jnp.float32).astype(dt)
    anc = jnp.asarray(ancestors(parents(rng, spec)))
    return q, keys, values, jnp.asarray(starts(rng, spec)), anc
