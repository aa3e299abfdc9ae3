"""The tree every decoding method verifies (DESIGN.md section 2): AR is one node, DFlash a chain."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Tree:
    """N nodes per sequence in a topological order (parents before children); node 0 is the root.

    parent: [B, N] int32, -1 at the root.  depth: [B, N] int32, 0 at the root.
    anc: [B, N, N] bool, anc[b, i, j] iff j is an ancestor-or-self of i.
    chain: static; True when node i's parent is i - 1 for every i (prefill chunks, DFlash), which lets
    the delta rule run in fixed-size chunks with the state carried between them.
    max_depth: static; no node is deeper than this (None: not known, up to N - 1). An accepted path then
    has at most max_depth + 1 nodes, and commit folds only those into the GDN state.
    """

    parent: jax.Array
    depth: jax.Array
    anc: jax.Array
    chain: bool = dataclasses.field(default=False, metadata=dict(static=True))
    max_depth: int | None = dataclasses.field(default=None, metadata=dict(static=True))

    @property
    def size(self) -> int:
        return self.parent.shape[1]

    @property
    def longest_path(self) -> int:
        """Nodes on the longest root-to-node path the tree can have (static)."""
        return self.size if self.max_depth is None else min(self.size, self.max_depth + 1)


def chain(batch: int, n: int) -> Tree:
    idx = jnp.arange(n, dtype=jnp.int32)
    parent = jnp.broadcast_to(idx - 1, (batch, n))
    depth = jnp.broadcast_to(idx, (batch, n))
    anc = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (batch, n, n))
    return Tree(parent, depth, anc, chain=True)


def forest(batch: int, n: int) -> Tree:
    """n roots side by side: no node is another's ancestor, so only node 0 can be on an accepted path."""
    parent = jnp.full((batch, n), -1, jnp.int32)
    anc = jnp.broadcast_to(jnp.eye(n, dtype=bool), (batch, n, n))
    return Tree(parent, jnp.zeros((batch, n), jnp.int32), anc, chain=False, max_depth=0)


def from_parents(parent: jax.Array) -> Tree:
    """Depths and the ancestor mask from parents [B, N] given in a topological order: each node's parent is -1 (a
    root) or an earlier node. Concrete parents that break this are refused (traced ones are not checked)."""
    if not isinstance(parent, jax.core.Tracer):
        p = np.asarray(parent)
        bad = np.argwhere((p != -1) & ~((p >= 0) & (p < np.arange(p.shape[-1])))) if p.ndim == 2 else None
        if bad is None or len(bad):
            where = "" if bad is None else f": row {bad[0][0]}, node {bad[0][1]} has parent {p[tuple(bad[0])]}"
            raise ValueError(f"from_parents: parents [B, N] must each be -1 or an earlier node{where}")
    parent = jnp.asarray(parent, jnp.int32)
    b, n = parent.shape
    eye = jnp.broadcast_to(jnp.eye(n, dtype=bool), (b, n, n))

    def step(i, carry):
        anc, depth = carry
        p = parent[:, i]
        has = p >= 0
        row = jnp.where(has[:, None], jnp.take_along_axis(anc, jnp.maximum(p, 0)[:, None, None], 1)[:, 0], False)
        anc = anc.at[:, i].set(row | eye[:, i])
        d = jnp.where(has, jnp.take_along_axis(depth, jnp.maximum(p, 0)[:, None], 1)[:, 0] + 1, 0)
        return anc, depth.at[:, i].set(d)

    anc, depth = jax.lax.fori_loop(0, n, step, (eye, jnp.zeros((b, n), jnp.int32)))
    return Tree(parent, depth, anc, chain=False)


def ancestor_at(tree: Tree, distance: int) -> jax.Array:
    """Index of each node's ancestor `distance` steps up, or -1 past the root. [B, N]"""
    node = jnp.broadcast_to(jnp.arange(tree.size, dtype=jnp.int32), tree.parent.shape)
    for _ in range(distance):
        node = jnp.where(node >= 0, jnp.take_along_axis(tree.parent, jnp.maximum(node, 0), 1), -1)
    return node
