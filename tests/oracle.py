"""Oracle drafters: test doubles that propose the target's own greedy continuation, corrupted at a
random depth, so that every acceptance length occurs (DESIGN.md section 6). Random drafters are
almost never accepted and prove little about losslessness."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import tree as trees
from jaxspec.engine import Proposal, Speculator


def reference(prompts, continuations, pad: int):
    """[B, T] array of prompt + the target's own continuation (zero-padded): what oracles propose from."""
    rows = [list(p) + list(t) + [0] * pad for p, t in zip(prompts, continuations)]
    width = max(map(len, rows))
    return np.array([r + [0] * (width - len(r)) for r in rows], np.int32)


class OracleChain(Speculator):
    """Greedy: a chain [pending, ref[pos+1], ..., ref[pos+N-1]] with the node at a uniformly random
    depth k in 1..N replaced by a wrong token (k = N: nothing corrupted), so exactly k tokens are
    accepted. Sampled (`vocab` given, `ref` None): drafts d_j ~ q_j with q_j a random distribution
    per round and depth, and their log-probs passed on for rejection sampling."""

    name = "oracle-chain"

    def __init__(self, n: int, vocab: int, ref=None):
        self.tree_size, self.vocab, self.ref = n, vocab, ref

    def init(self, batch, max_len):
        return jnp.zeros((batch,), jnp.int32)              # committed length, mirrored

    def start(self, params, model, pos, taps, n, tokens):
        return pos + n

    def update(self, params, model, pos, taps, path, n):
        return pos + n

    def propose(self, params, model, pos, pending, key, sampling):
        b, n = pending.shape[0], self.tree_size
        k1, k2 = jax.random.split(key)
        if self.ref is not None:
            ref = jnp.asarray(self.ref)
            idx = jnp.clip(pos[:, None] + jnp.arange(1, n), 0, ref.shape[1] - 1)
            drafts = jnp.take_along_axis(ref, idx, 1)
            bad = jax.random.randint(k1, (b, 1), 1, n + 1)            # depth of the corrupted node
            wrong = (drafts + jax.random.randint(k2, drafts.shape, 1, self.vocab)) % self.vocab
            drafts = jnp.where(jnp.arange(1, n)[None] == bad, wrong, drafts)
            return Proposal(jnp.concatenate([pending[:, None], drafts], 1), trees.chain(b, n)), pos
        logq = jax.nn.log_softmax(2.0 * jax.random.normal(k1, (b, n, self.vocab)), -1)
        drafts = jax.random.categorical(k2, logq[:, 1:], -1).astype(jnp.int32)
        return Proposal(jnp.concatenate([pending[:, None], drafts], 1), trees.chain(b, n), logq), pos


class OracleTree(Speculator):
    """DDTree with oracle marginals: at depth d the target's true continuation ref[pos + d] is put at
    rank 0, 1, 2 (probabilities 0.5, 0.2, 0.15) or far down (0.15) of an otherwise random per-depth
    distribution, and the tree of `budget` best prefixes is built from them exactly as for DFlash
    drafts. True tokens at rank > 0 sit on sibling branches, so accepted paths leave the spine (the
    chain of per-depth argmaxes); the state counts those off-spine acceptances."""

    name = "oracle-tree"

    def __init__(self, depth: int, budget: int, vocab: int, ref):
        self.depth, self.budget, self.vocab, self.ref = depth, budget, vocab, ref
        self.tree_size = budget + 1

    def init(self, batch, max_len):
        z = jnp.zeros((batch,), jnp.int32)
        return dict(pos=z, off_spine=z, spine=jnp.zeros((batch, self.tree_size), bool))

    def start(self, params, model, st, taps, n, tokens):
        return {**st, "pos": st["pos"] + n}

    def update(self, params, model, st, taps, path, n):
        k = jnp.arange(path.shape[1])[None]
        on = jnp.take_along_axis(st["spine"], path, 1)
        off = ((k >= 1) & (k < n[:, None]) & ~on).sum(1)
        return {**st, "pos": st["pos"] + n, "off_spine": st["off_spine"] + off}

    def propose(self, params, model, st, pending, key, sampling):
        from jaxspec.ddtree import build_tree
        b, d, v = pending.shape[0], self.depth, self.vocab
        k1, k2 = jax.random.split(key)
        ref = jnp.asarray(self.ref)
        idx = jnp.clip(st["pos"][:, None] + jnp.arange(1, d + 1), 0, ref.shape[1] - 1)
        true = jnp.take_along_axis(ref, idx, 1)                                     # [B, D]
        logits = jax.random.normal(k1, (b, d, v))
        onehot = jax.nn.one_hot(true, v, dtype=bool)
        others = jnp.sort(jnp.where(onehot, -jnp.inf, logits), -1)[..., ::-1]      # without the true token
        rank = jax.random.choice(k2, jnp.array([0, 1, 2, min(v - 2, 40)]), (b, d), p=jnp.array([.5, .2, .15, .15]))
        val = jnp.take_along_axis(others, rank[..., None], -1)[..., 0] + 1e-3       # just above rank `rank`
        logits = jnp.where(onehot, val[..., None], logits)
        tree = build_tree(jax.nn.log_softmax(logits, -1), pending, self.budget)
        top = jnp.argmax(logits, -1)                                                # [B, D] the spine
        depth = tree.tree.depth
        is_top = (jnp.take_along_axis(top, jnp.clip(depth - 1, 0, d - 1), 1) == tree.tokens) | (depth == 0)
        # A node is on the spine when it and all its ancestors are their depth's argmax.
        spine = (~is_top[:, None, :] & tree.tree.anc).sum(-1) == 0
        return Proposal(tree.tokens, tree.tree), {**st, "spine": spine}
