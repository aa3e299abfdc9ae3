"""DFlash speculation on the one engine: the drafter proposes a chain [anchor, d1 .. d_{B-1}] in one
pass; the engine verifies it, accepts (longest matching prefix, or rejection sampling) and commits;
the taps of the accepted rows become the drafter's next context rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec import tree as trees
from jaxspec.config import ConfigError, TargetConfig
from jaxspec.drafter import Drafter, init_cache
from jaxspec.drafter_config import check_pair
from jaxspec.engine import Proposal, Speculator
from jaxspec.sampling import log_probs


class DFlash(Speculator):
    name = "dflash"

    def __init__(self, drafter: Drafter, target: TargetConfig, block_size: int | None = None):
        cfg = drafter.cfg
        check_pair(cfg, target)
        bs = cfg.block_size if block_size is None else int(block_size)
        if not 2 <= bs <= cfg.block_size:
            raise ConfigError(f"--block-size {bs}: must be in [2, {cfg.block_size}] (the drafter was trained "
                              f"with blocks of {cfg.block_size})")
        self.cfg, self.tree_size, self.taps = cfg, bs, tuple(cfg.target_layer_ids)
        self.graphdef, self.params = nnx.split(drafter)

    def _drafter(self, params) -> Drafter:
        return nnx.merge(self.graphdef, params)

    def init(self, batch, max_len):
        return init_cache(self.cfg, batch, max_len)

    def start(self, params, model, cache, taps, n):
        return self._drafter(params).add_context(cache, taps, n)

    def propose(self, params, model, cache, pending, key, sampling):
        logits = self._drafter(params).draft(cache, pending, model.embed_tokens[...], model.unembedding(),
                                             self.tree_size)                            # [B, bs-1, V]
        b = pending.shape[0]
        if sampling.greedy:
            drafts, logq = jnp.argmax(logits, -1).astype(jnp.int32), None
        else:
            lq = log_probs(logits, sampling)
            drafts = jax.random.categorical(key, lq, -1).astype(jnp.int32)
            logq = jnp.concatenate([jnp.zeros_like(lq[:, :1]), lq], 1)                  # row 0: the anchor
        return Proposal(jnp.concatenate([pending[:, None], drafts], 1), trees.chain(b, self.tree_size), logq)

    def update(self, params, model, cache, taps, path, n):
        # The accepted rows' taps are exact (the verify was), so they are the next context rows.
        along = jnp.take_along_axis(taps, path[:, :, None, None], 1)
        return self._drafter(params).add_context(cache, along, n)
