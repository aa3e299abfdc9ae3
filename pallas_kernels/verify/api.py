"""The public per-node target choice: one contract (reference.target_choice), several implementations.

| implementation     | what                                                               | default      |
| ------------------ | ------------------------------------------------------------------ | ------------ |
| "reference"        | jnp.argmax / Gumbel-max on jax.random bits (reference.categorical) | elsewhere    |
| "xla"              | the kernel's hash Gumbel-max in jnp (reference.gumbel_choice)       | never        |
| "pallas_triton"    | one pass over the logits, Triton lowering (pallas_triton.py)       | on GPU       |
| "pallas_interpret" | the kernel's body run by the CPU interpreter                       | never (tests)|

Greedy gives the same tokens whatever the implementation for logits without NaN: argmax, lowest index on
ties, -inf and +inf entries included (a row of only -inf gives 0). A row holding a NaN is outside that
promise: "reference" and "xla" give the first NaN's index (jnp.argmax), the kernel's choice there is
unspecified (0 in interpret mode). Sampling at a temperature draws from the same distribution,
softmax(logits / T), but from different random bits: "reference" draws jax.random bits per row
(reference.categorical), the same as jaxspec's other samplers. An explicit `implementation=` wins; else
the environment variable JAXSPEC_VERIFY (read when the caller is traced); else the kernel on a GPU (its 12
GPU tests passed on the H200: bench/results/2026-11-29-h200x2-kernel-gpu-tests.log) and "reference"
elsewhere. Under a mesh the logits are sharded (vocabulary over "model", rows over "data"):
jaxspec/sampling.py then runs `choice_partial` per shard and combines the shards' bests
(jaxspec/sharding.py `vocab_choice`), which gives the unsharded tokens.
"""

from __future__ import annotations

import math
import numbers

import jax.numpy as jnp

from pallas_kernels import dispatch
from pallas_kernels.verify import pallas_triton, reference

ENV_VAR = "JAXSPEC_VERIFY"
IMPLEMENTATIONS = ("reference", "xla", "pallas_triton", "pallas_interpret")


def resolve(implementation: str | None = None) -> str:
    """The implementation that `target_choice` runs."""
    default = "pallas_triton" if dispatch.on_gpu() else "reference"
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, default, implementation)


def target_choice(key, logits, temperature: float, *, implementation: str | None = None):
    """The target's choice at every row of logits [..., V]: argmax at temperature 0, else one
    independent sample of softmax(logits / T) per row, from `key` (a jax.random key; unused when
    greedy, may be None then). Returns [...] int32. temperature: a Python number, 0 <= T < inf (`check_args`);
    no rows gives an empty result, an empty vocabulary (V = 0) a ValueError, as jnp.argmax does."""
    name = resolve(implementation)
    check_args("target_choice", key, logits, temperature)
    if math.prod(logits.shape[:-1]) == 0:        # no rows (the kernel's split count would divide by zero)
        return jnp.zeros(logits.shape[:-1], jnp.int32)
    if name == "reference":
        return reference.target_choice(key, logits, temperature)
    val, idx = choice_partial(key, logits.reshape(-1, logits.shape[-1]), temperature, implementation=name)
    return combine(val[:, None], idx[:, None]).reshape(logits.shape[:-1])


def combine(val, idx):
    """[R, S] partial bests of S slices of each row, in column order (`choice_partial`) -> [R] int32 the
    choice over the whole rows: the first best; 0 for a row where no slice saw a column."""
    _, best = pallas_triton.combine(val, idx)
    return jnp.where(best == pallas_triton.NONE, 0, best)


def choice_partial(key, logits, temperature: float, row0=0, col0=0, *, implementation: str | None = None,
                   **tuning):
    """For one slice [R, V] of a larger logits matrix, starting at global row row0 and column col0 (a
    shard of a tensor-parallel vocabulary): ([R] best value, [R] its global column), with the hash
    Gumbel-max noise of the global positions, so that the slices' bests (first on ties, in column order:
    pallas_triton.combine) give the choice over the whole rows. Implementations "xla" and the kernel's;
    `tuning` (block_v, splits, num_warps) goes to the kernel."""
    name = resolve(implementation)
    if name == "reference":
        raise ValueError("choice_partial: 'reference' (jax.random) has no per-slice form; use 'xla' or a kernel")
    check_args("choice_partial", key, logits, temperature)
    if logits.ndim != 2:
        raise ValueError(f"choice_partial: logits {logits.shape} must be [R, V]")
    if logits.shape[0] == 0:
        return jnp.zeros((0,), jnp.float32), jnp.zeros((0,), jnp.int32)
    seed = jnp.zeros((2,), jnp.uint32) if key is None or temperature == 0.0 else reference.seed_words(key)
    if name == "xla":
        if tuning:
            raise ValueError(f"choice_partial: {sorted(tuning)} tune the kernel; implementation 'xla' has none")
        return reference.gumbel_partial(seed, logits, temperature, row0, col0)
    return pallas_triton.gumbel_partial(seed, logits, temperature, row0, col0, interpret=name == "pallas_interpret",
                                        **tuning)


def check_args(op: str, key, logits, temperature):
    """ValueError unless logits [..., V] with V > 0, and temperature 0 <= T < inf with a key when T > 0 (a Python
    number, static in every caller; one that is not, e.g. traced, is left unchecked)."""
    if logits.ndim < 1 or logits.shape[-1] == 0:
        raise ValueError(f"{op}: logits {logits.shape} must be [..., V] with V > 0")
    if isinstance(temperature, numbers.Real):
        if not 0.0 <= temperature < math.inf:
            raise ValueError(f"{op}: temperature must be >= 0 and finite, got {temperature}")
        if temperature > 0 and key is None:
            raise ValueError(f"{op}: temperature {temperature} > 0 needs a key (a jax.random key), got None")
