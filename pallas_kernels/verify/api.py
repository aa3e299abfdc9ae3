"""The public per-node target choice: one contract (reference.target_choice), several implementations.

| implementation     | what                                                               | default      |
| ------------------ | ------------------------------------------------------------------ | ------------ |
| "reference"        | jnp.argmax / jax.random.categorical (reference.target_choice)      | elsewhere    |
| "xla"              | the kernel's hash Gumbel-max in jnp (reference.gumbel_choice)       | never        |
| "pallas_triton"    | one pass over the logits, Triton lowering (pallas_triton.py)       | on one GPU   |
| "pallas_interpret" | the kernel's body run by the CPU interpreter                       | never (tests)|

Greedy gives the same tokens whatever the implementation (argmax, lowest index on ties). Sampling at a
temperature draws from the same distribution, softmax(logits / T), but from different random bits:
"reference" keeps the tokens jaxspec produced before this op existed. An explicit `implementation=`
wins; else the environment variable JAXSPEC_VERIFY (read when the caller is traced); else the kernel on
one GPU (its 12 GPU tests passed on the H200: bench/results/2026-11-29-h200x2-kernel-gpu-tests.log);
"reference" under a mesh of several devices, where the logits are sharded (vocabulary over "model",
rows over "data") and XLA partitions argmax / categorical itself (the kernel is not run per shard yet:
it would need a combine across vocabulary shards), and "reference" off the GPU.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels import dispatch
from pallas_kernels.verify import pallas_triton, reference

ENV_VAR = "JAXSPEC_VERIFY"
IMPLEMENTATIONS = ("reference", "xla", "pallas_triton", "pallas_interpret")


def resolve(implementation: str | None = None) -> str:
    """The implementation that `target_choice` runs."""
    default = "pallas_triton" if dispatch.on_gpu() and dispatch.mesh_size() == 1 else "reference"
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, default, implementation)


def target_choice(key, logits, temperature: float, *, implementation: str | None = None):
    """The target's choice at every row of logits [..., V]: argmax at temperature 0, else one
    independent sample of softmax(logits / T) per row, from `key` (a jax.random key; unused when
    greedy, may be None then). Returns [...] int32."""
    name = resolve(implementation)
    if name == "reference":
        return reference.target_choice(key, logits, temperature)
    seed = jnp.zeros((2,), jnp.uint32) if key is None or temperature == 0.0 else reference.seed_words(key)
    x = logits.reshape(-1, logits.shape[-1])
    if name == "xla":
        out = reference.gumbel_choice(seed, x, temperature)
    else:
        out = pallas_triton.gumbel_choice(seed, x, temperature, interpret=name == "pallas_interpret")
    return out.reshape(logits.shape[:-1])
