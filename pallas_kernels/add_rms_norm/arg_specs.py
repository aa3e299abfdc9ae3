"""Shapes and random inputs shared by the tests and the benchmark: residual-stream rows, the block's update and a
norm weight."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

# Qwen3.6-27B: hidden size 5120, bf16; 64 layers make 127 residual adds with a norm after them a step (each layer's
# post-attention norm and the next layer's input norm, less the first layer's input norm, which has no add)
REAL_WIDTH = 5120
REAL_NORMS = 127


def make_inputs(seed, shape, dtype):
    """x [..., D] (scale 3, as a residual stream grows), u [..., D] and w [D] (scale 0.1: the zero-centred weight)."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal(shape) * 3, jnp.float32).astype(dtype)
    u = jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)
    w = jnp.asarray(rng.standard_normal(shape[-1:]) * 0.1, jnp.float32).astype(dtype)
    return x, u, w


def make_slices(seed, slices, shape, dtype=jnp.float32):
    """The update as `slices` K slices [S, *shape] (each of scale 1 / sqrt(S), so that their sum is of scale 1), as
    jaxspec.model.Linear hands them over: fp32 by default."""
    rng = np.random.default_rng(seed + 1000)
    return jnp.asarray(rng.standard_normal((slices,) + tuple(shape)) / np.sqrt(slices), jnp.float32).astype(dtype)
