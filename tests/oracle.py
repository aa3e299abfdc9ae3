"""Oracle drafters: test doubles that propose the target's own greedy continuation, corrupted at a
random depth, so that every acceptance length occurs (DESIGN.md section 6). Random drafters are
almost never accepted and prove little about losslessness."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxspec import tree as trees
from jaxspec.engine import Proposal, Speculator


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

    def start(self, params, model, pos, taps, n):
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
            return Proposal(jnp.concatenate([pending[:, None], drafts], 1), trees.chain(b, n))
        logq = jax.nn.log_softmax(2.0 * jax.random.normal(k1, (b, n, self.vocab)), -1)
        drafts = jax.random.categorical(k2, logq[:, 1:], -1).astype(jnp.int32)
        return Proposal(jnp.concatenate([pending[:, None], drafts], 1), trees.chain(b, n), logq)
