"""Sampling parameters and the per-node target choice used by `accept`."""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp

from jaxspec import sharding
from jaxspec.ddtree import vocab_top_k
from pallas_kernels.nucleus_mass import api as nucleus_mass
from pallas_kernels.nucleus_mass.reference import ordered_key, unordered
from pallas_kernels.verify import api as verify_api
from pallas_kernels.verify.reference import categorical


MIN_TEMPERATURE = 1e-4     # the smallest positive temperature: logits / T stays far inside float32's range


def seed_problem(seed: int, name: str) -> str | None:
    """Why `seed` cannot seed jax.random.key (or nnx.Rngs), which take an int64; None if it can."""
    if not -2**63 <= seed < 2**63:
        return f"{name} must be a 64-bit integer (-2**63 to 2**63 - 1), got {seed}"
    return None


@dataclasses.dataclass(frozen=True)
class Sampling:
    """temperature 0 means greedy. top_k 0 means no top-k cut; top_p 1.0 no nucleus cut."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, numbers.Real):
            raise ValueError(f"--temperature must be a number, got {self.temperature!r}")
        if not 0.0 <= self.temperature < math.inf:
            raise ValueError(f"--temperature must be >= 0 and finite, got {self.temperature}")
        if 0.0 < self.temperature < MIN_TEMPERATURE:   # logits / T would overflow float32 into inf - inf = NaN
            raise ValueError(f"--temperature must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got {self.temperature:g}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral):
            raise ValueError(f"--top-k must be an integer, got {self.top_k!r}")
        object.__setattr__(self, "top_k", int(self.top_k))      # a numpy integer becomes a plain int
        if self.top_k < 0:
            raise ValueError(f"--top-k must be >= 0 (0 disables it), got {self.top_k}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, numbers.Real):
            raise ValueError(f"--top-p must be a number, got {self.top_p!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def cut_problem(s: Sampling) -> str | None:
    """Why a command line's --top-k/--top-p cannot be taken with `s`'s temperature (they cut the distribution that
    sampling draws from; greedy draws nothing); None if they can."""
    if s.greedy and (s.top_k or s.top_p != 1.0):
        return "--top-k/--top-p only apply when sampling (--temperature > 0); greedy takes the argmax"
    return None


def log_probs(logits, s: Sampling):
    """Log-probabilities after temperature, top-k and top-p; -inf outside the kept set. [..., V]"""
    return jax.nn.log_softmax(transformed(logits, s), -1)


def transformed(logits, s: Sampling):
    """logits / T, -inf outside what top-k and top-p keep: the sampled distribution's logits, unnormalised. [..., V]

    Top-k keeps every entry >= the k-th largest (ties at the k-th value included, as transformers' warper
    does). Top-p then keeps the fewest largest values whose mass reaches top_p: an entry stays when the mass of
    the entries strictly above its value is < top_p (the largest always stays). With top-k set, both cuts come
    from the k candidates of the staged top-k (`ddtree.vocab_top_k`: per vocabulary shard under a
    tensor-parallel mesh, and on a GPU without a sort of the vocabulary), since every entry above the k-th value
    is one of them; only the normaliser reads the whole row. Top-p alone searches for its cut
    (`searched_nucleus_cut`), which sorts nothing either and, under a mesh, only sums each shard's slice."""
    x = logits.astype(jnp.float32) / s.temperature
    if s.top_k:
        top = vocab_top_k(x, min(s.top_k, x.shape[-1]))[0]            # [..., k], descending
        cut = top[..., -1:]
        x = jnp.where(x < cut, -jnp.inf, x)
        if s.top_p < 1.0:
            cut = nucleus_cut(top, jnp.exp(x - top.max(-1, keepdims=True)).sum(-1, keepdims=True), s.top_p)
    elif s.top_p < 1.0:
        cut = searched_nucleus_cut(x, s.top_p)
    if s.top_p < 1.0:
        x = jnp.where(x < cut, -jnp.inf, x)
    return x


def search_passes(ways: int) -> int:
    """Passes `searched_nucleus_cut` needs to narrow the 2^32 keys to one with `ways` - 1 thresholds a pass."""
    span, n = 2 ** 32 - 1, 0
    while span > 1:
        step = max(span // ways, 1)
        span, n = max(step, span - step * (ways - 1)), n + 1
    return n


def nucleus_ways() -> int:
    """Thresholds tried per pass over the row, plus one: a GPU reads the row 9 times at 16 (each pass's 15 masked
    sums cost little beside reading the row); a CPU, where the sums are the cost, bisects in 32 passes."""
    return 16 if jax.default_backend() == "gpu" else 2


def searched_nucleus_cut(x, top_p: float, ways: int | None = None):
    """The smallest value top-p keeps in x [..., V] (float32, no NaN), without sorting. The mass of the entries
    above a threshold only falls as the threshold rises, so search the 2^32 float32 keys for the lowest one above
    which the mass is < top_p, `ways` - 1 thresholds a pass (`nucleus_ways()` by default; 2 is bisection). That
    key is one of x's values (the mass changes only at them), so the result equals the sorted cumulative sum's cut
    up to the sums' rounding. Each pass's sums are pallas_kernels/nucleus_mass (JAXSPEC_NUCLEUS_MASS; under a mesh
    always its jnp reference, which sums over the vocabulary's shards)."""
    ways = ways or nucleus_ways()
    key = ordered_key(x)
    e = jnp.exp(x - jnp.max(x, -1, keepdims=True))
    impl = nucleus_mass.resolve()                 # checks JAXSPEC_NUCLEUS_MASS with or without a mesh
    impl = impl if jax.sharding.get_abstract_mesh().empty else "reference"
    mass_above = lambda t: nucleus_mass.mass_above(key, e, t, implementation=impl)
    lo = jnp.zeros(x.shape[:-1] + (1,), jnp.uint32)                          # below every key: all the mass
    hi = jnp.max(key, -1, keepdims=True)                                       # the top entry: no mass above
    goal = top_p * jnp.sum(e, -1, keepdims=True)                               # every key is above lo

    def narrow(_, bounds):
        lo, hi = bounds
        step = jnp.maximum((hi - lo) // ways, 1)
        t = jnp.minimum(lo + step * jnp.arange(1, ways, dtype=jnp.uint32), hi)     # [..., ways - 1]
        below = jnp.concatenate([mass_above(t) < goal, jnp.ones_like(lo, bool)], -1)
        edges = jnp.concatenate([lo, t, hi], -1)                              # [..., ways + 1]
        m = jnp.argmax(below, -1)[..., None]                                  # the first threshold below the goal
        return jnp.take_along_axis(edges, m, -1), jnp.take_along_axis(edges, m + 1, -1)

    return unordered(jax.lax.fori_loop(0, search_passes(ways), narrow, (lo, hi))[1])


def nucleus_cut(srt, z, top_p: float):
    """The smallest value top-p keeps. srt [..., c]: the row's largest values, descending, holding every entry
    the cut can keep; z [..., 1]: the sum of exp(x - max) over the row's kept entries. (The max is taken, not
    sliced: a second slice of lax.top_k's values made XLA's CPU backend sort the whole row instead.)"""
    p = jnp.exp(srt - srt.max(-1, keepdims=True)) / z
    before = jnp.cumsum(p, -1) - p                 # mass strictly above each sorted entry (its first tie)
    keep = before < top_p                          # the top entry is always kept
    return jnp.min(jnp.where(keep, srt, jnp.inf), -1, keepdims=True)


def choose(key, logits, s: Sampling):
    """The target's own choice at every position: argmax, or one independent sample each. [...]
    Greedy and temperature-only sampling go through the verify op (pallas_kernels/verify, dispatched by
    JAXSPEC_VERIFY: the kernel on GPU, this module's jnp math elsewhere; per vocabulary shard under a
    tensor-parallel mesh); top-k / top-p stay here."""
    if s.greedy:
        return target_choice(key, logits, 0.0)
    if s.top_k == 0 and s.top_p == 1.0:
        return target_choice(key, logits, s.temperature)
    return categorical(key, transformed(logits, s))     # Gumbel-max needs no normalising


def target_choice(key, logits, temperature: float):
    """The verify op; with a per-slice implementation under a mesh, run per shard (sharding.vocab_choice)."""
    if verify_api.resolve() != "reference":
        partial = lambda rows, row0, col0: verify_api.choice_partial(key, rows, temperature, row0, col0)
        out = sharding.vocab_choice(partial, verify_api.combine, logits)
        if out is not None:
            return out
    return verify_api.target_choice(key, logits, temperature)
