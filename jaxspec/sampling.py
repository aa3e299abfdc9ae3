"""Sampling parameters and the per-node target choice used by `accept`."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec import sharding
from pallas_kernels.verify import api as verify_api


@dataclasses.dataclass(frozen=True)
class Sampling:
    """temperature 0 means greedy. top_k 0 means no top-k cut; top_p 1.0 no nucleus cut."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0.0:
            raise ValueError(f"--temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"--top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def log_probs(logits, s: Sampling):
    """Log-probabilities after temperature, top-k and top-p; -inf outside the kept set. [..., V]"""
    x = logits.astype(jnp.float32) / s.temperature
    if s.top_k:
        kth = jax.lax.top_k(x, min(s.top_k, x.shape[-1]))[0][..., -1:]
        x = jnp.where(x < kth, -jnp.inf, x)
    if s.top_p < 1.0:
        srt = jnp.sort(x, -1)[..., ::-1]
        p = jax.nn.softmax(srt, -1)
        before = jnp.cumsum(p, -1) - p                 # mass strictly above each sorted entry
        keep = before < s.top_p                        # the top entry is always kept
        cut = jnp.min(jnp.where(keep, srt, jnp.inf), -1, keepdims=True)
        x = jnp.where(x < cut, -jnp.inf, x)
    return jax.nn.log_softmax(x, -1)


def choose(key, logits, s: Sampling):
    """The target's own choice at every position: argmax, or one independent sample each. [...]
    Greedy and temperature-only sampling go through the verify op (pallas_kernels/verify, dispatched by
    JAXSPEC_VERIFY: the kernel on GPU, this module's jnp math elsewhere; per vocabulary shard under a
    tensor-parallel mesh); top-k / top-p stay here."""
    if s.greedy:
        return target_choice(key, logits, 0.0)
    if s.top_k == 0 and s.top_p == 1.0:
        return target_choice(key, logits, s.temperature)
    return jax.random.categorical(key, log_probs(logits, s), -1).astype(jnp.int32)


def target_choice(key, logits, temperature: float):
    """The verify op; with a per-slice implementation under a mesh, run per shard (sharding.vocab_choice)."""
    if verify_api.resolve() != "reference":
        partial = lambda rows, row0, col0: verify_api.choice_partial(key, rows, temperature, row0, col0)
        out = sharding.vocab_choice(partial, verify_api.combine, logits)
        if out is not None:
            return out
    return verify_api.target_choice(key, logits, temperature)
