"""DFlash and DDTree speculation on the one engine. One drafter pass gives per-depth distributions for
the block [anchor, MASK x (B-1)]; DFlash proposes their chain [anchor, d1 .. d_{B-1}], DDTree the
`budget` most probable prefixes as a tree. The engine verifies, accepts (walk along the target's
choice, or rejection sampling on a sampled chain) and commits; the taps of the accepted nodes become
the drafter's next context rows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec import tree as trees
from jaxspec.config import ConfigError, TargetConfig
from jaxspec.drafter import Drafter, init_cache
from jaxspec.ddtree import build_tree
from jaxspec.drafter_config import check_pair
from jaxspec.engine import Proposal, Speculator, int_arg
from jaxspec.sampling import categorical, log_probs


def block_size_for(cfg, block_size: int | None) -> int:
    """The block a drafter of `cfg` drafts: `block_size` (--block-size), or the one it was trained with. A ConfigError
    unless 2 <= it <= the trained block."""
    bs = cfg.block_size if block_size is None else int_arg(block_size, "--block-size", ConfigError)
    if not 2 <= bs <= cfg.block_size:
        raise ConfigError(f"--block-size {bs}: must be in [2, {cfg.block_size}] (the drafter was trained "
                          f"with blocks of {cfg.block_size})")
    return bs


def default_draft_dtype(backend: str, target_dtype: str) -> str:
    """The drafter's dtype when none is asked for: bfloat16 under a float32 target on a GPU, else the target's.

    The drafter only proposes and the target checks every token, so its dtype changes speed and acceptance, never the
    output. On the H200 session 35's demo pair (fp32 target) with its drafter in bfloat16 ran DFlash at 1.13x AR on
    16 held-out prompts against 0.91x with it in fp32, the same tau (2.97) and identical to AR on every prompt
    (bench/results/2026-12-03-h200-s35/). A CPU keeps the target's dtype: not every CPU does bfloat16 products fast.
    """
    target_dtype = jnp.dtype(target_dtype).name
    return "bfloat16" if backend != "cpu" and target_dtype == "float32" else target_dtype


def budget_problem(budget: int, context: int) -> str | None:
    """Why a DDTree budget is refused, or None: a sanity cap, not a limit of the engine. A tree's nodes sit at
    positions of the committed length + their depth, so they never use up the context; but a tree with more nodes
    than the target's whole context (max_position_embeddings; 0: none) is a slip, one whose every round verifies
    thousands of rows (`--budget 5000` on the CPU demo ran for minutes without a token)."""
    if context and budget + 1 > context:
        return (f"--budget {budget}: a tree of {budget + 1} nodes is more than the target's whole context "
                f"(max_position_embeddings {context}); DDTree's trees are tens to hundreds of nodes")
    return None


class DFlash(Speculator):
    """DFlash (budget None) or DDTree (budget B: a tree of B + 1 nodes, depth <= block_size - 1)."""

    layout = ("DFlash drafter", "drafter", "shard_drafter")

    def __init__(self, drafter: Drafter, target: TargetConfig, block_size: int | None = None,
                 budget: int | None = None):
        cfg = drafter.cfg
        check_pair(cfg, target)
        bs = block_size_for(cfg, block_size)
        budget = None if budget is None else int_arg(budget, "--budget", ConfigError)
        if budget is not None and budget < 1:
            raise ConfigError(f"--budget {budget}: must be >= 1")
        if budget is not None and (problem := budget_problem(budget, target.max_position_embeddings)):
            raise ConfigError(problem)
        self.cfg, self.block_size, self.budget, self.taps = cfg, bs, budget, tuple(cfg.target_layer_ids)
        self.target_cfg = target     # the engine checks that it runs this drafter on this target
        self.name = "dflash" if budget is None else "ddtree"
        self.tree_size = bs if budget is None else budget + 1
        self.graphdef, self.params = nnx.split(drafter)

    def _drafter(self, params) -> Drafter:
        return nnx.merge(self.graphdef, params)

    def init(self, batch, max_len):
        return init_cache(self.cfg, batch, max_len)

    def start(self, params, model, cache, taps, n, tokens):
        return self._drafter(params).add_context(cache, taps, n)

    def propose(self, params, model, cache, pending, key, sampling):
        logits, cache = self._drafter(params).draft(cache, pending, model.embed_tokens[...], model.unembedding(),
                                             self.block_size)                           # [B, bs-1, V]
        b = pending.shape[0]
        if self.budget is not None:
            # Greedy verification only needs the drafter's own ranking; sampled verification walks
            # independent per-node samples of the target, so the tree may come from the same
            # transformed distribution the target samples from.
            logp = jax.nn.log_softmax(logits, -1) if sampling.greedy else log_probs(logits, sampling)
            tree = build_tree(logp, pending, self.budget)
            return Proposal(tree.tokens, tree.tree), cache
        if sampling.greedy:
            drafts, logq = jnp.argmax(logits, -1).astype(jnp.int32), None
        else:
            lq = log_probs(logits, sampling)
            drafts = categorical(key, lq)
            logq = jnp.concatenate([jnp.zeros_like(lq[:, :1]), lq], 1)                  # row 0: the anchor
        return Proposal(jnp.concatenate([pending[:, None], drafts], 1), trees.chain(b, self.tree_size), logq), cache

    def update(self, params, model, cache, taps, path, n):
        # The accepted rows' taps are exact (the verify was), so they are the next context rows.
        along = jnp.take_along_axis(taps, path[:, :, None, None], 1)
        return self._drafter(params).add_context(cache, along, n)
