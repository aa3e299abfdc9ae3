"""The mass of a row above each of its thresholds, the pure-jnp spec (what jaxspec.sampling always ran).

Thresholds are float32 keys (`ordered_key`): uint32 in the floats' order, so that a search over the 2^32 keys
(jaxspec/sampling.py `searched_nucleus_cut`) can halve or split any interval of floats, signs included."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def ordered_key(x):
    """float32 -> uint32 keys in the floats' order (-0.0 just below 0.0; NaN not expected)."""
    b = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return jnp.where(b >> 31 == 1, ~b, b | jnp.uint32(0x80000000))


def unordered(key):
    """The inverse of `ordered_key`."""
    return jax.lax.bitcast_convert_type(jnp.where(key >> 31 == 1, key & jnp.uint32(0x7FFFFFFF), ~key), jnp.float32)


def mass_above(key, e, t):
    """key [R, V] uint32 (`ordered_key` of a row of floats), e [R, V] float32 (each entry's mass), t [R, W] uint32
    thresholds -> [R, W] float32: the sum of e over the entries whose key is > t."""
    return jnp.sum(jnp.where(key[..., None, :] > t[..., None], e[..., None, :], 0.0), -1)
