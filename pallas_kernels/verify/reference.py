"""The target's choice at every tree node, from its logits [..., V]: the spec and the test oracles.

* `target_choice` is the spec: greedy is jnp.argmax (lowest index on ties); at temperature T a
  sample of softmax(logits / T) by `categorical`: Gumbel-max with jax.random bits drawn per row, so that a
  row's real entries get the same noise however wide the row is padded (a tensor-parallel vocabulary is
  padded to a multiple of the degree) or split over devices.
* `gumbel_choice` is the kernel's own math in jnp, bit for bit on the CPU: Gumbel-max,
  argmax_v(logits_v / T + g_v), with g_v = -log(-log(u_v)) and u_v a counter-based hash of
  (seed, row, v) instead of a stream of jax.random bits, so that the noise is made where the logits are
  read (one pass over them). It samples softmax(logits / T) up to the hash's 24-bit uniforms, which
  truncate the Gumbel tails at probabilities below 1e-7 (tests/test_verify_kernel.py checks the
  distribution).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def target_choice(key, logits, temperature: float):
    """[...] int32: argmax (temperature 0) or one independent sample per row."""
    if temperature == 0.0:
        return jnp.argmax(logits, -1).astype(jnp.int32)
    return categorical(key, logits.astype(jnp.float32) / temperature)   # Gumbel-max needs no normalising


def categorical(key, logits):
    """[...] int32: one sample of softmax(logits) per row of logits [..., V] (-inf allowed), as
    jax.random.categorical draws it (argmax of logits + Gumbel noise), but with row r's noise drawn from its own
    key, split r of `key`, over its V entries. With partitionable threefry (JAX's default) entry v's bits depend
    on v alone, not on V, so padding a row's end or sharding it leaves every sample as it was; one
    jax.random.categorical over the whole [..., V] array numbers its bits across rows, so padding moved them."""
    lead, v = logits.shape[:-1], logits.shape[-1]
    keys = jax.random.split(key, int(np.prod(lead, dtype=np.int64)))
    noise = jax.vmap(lambda k: jax.random.gumbel(k, (v,), jnp.float32))(keys).reshape(logits.shape)
    return jnp.argmax(logits.astype(jnp.float32) + noise, -1).astype(jnp.int32)


def seed_words(key):
    """Two uint32 words of a jax.random key: the kernel's seed."""
    return jax.random.bits(key, (2,), jnp.uint32)


def _mix(x):
    """A 32-bit integer finaliser (xor-shift-multiply): every input bit reaches every output bit."""
    x = x ^ (x >> 16)
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> 16)


def gumbel(seed, rows, cols):
    """Gumbel(0, 1) noise of element (row, col), uint32 rows/cols broadcast together; seed [2] uint32."""
    h = _mix(_mix(rows ^ seed[0]) + cols)
    h = _mix(h ^ seed[1])
    u = ((h >> 8).astype(jnp.int32).astype(jnp.float32) + 0.5) * np.float32(2.0 ** -24)   # in (0, 1)
    return -jnp.log(-jnp.log(u))


def gumbel_partial(seed, logits, temperature: float, row0=0, col0=0):
    """logits [R, V], the slice of global rows row0.. and columns col0.. of a larger [R', V'] ->
    ([R] f32 best value, [R] int32 its global column): the max over the slice of logits (temperature 0) or
    of logits / T + noise(global row, global column), and its first column. Bests of the slices of one
    row, taken in column order with the first on ties, give gumbel_choice of the whole row."""
    x = logits.astype(jnp.float32)
    if temperature != 0.0:
        r, v = x.shape
        rows = (jnp.arange(r, dtype=jnp.int32) + row0).astype(jnp.uint32)[:, None]
        cols = (jnp.arange(v, dtype=jnp.int32) + col0).astype(jnp.uint32)[None, :]
        x = x * np.float32(1.0 / temperature) + gumbel(seed, rows, cols)
    idx = jnp.argmax(x, -1).astype(jnp.int32)
    return jnp.take_along_axis(x, idx[:, None], -1)[:, 0], idx + col0


def gumbel_choice(seed, logits, temperature: float):
    """[R] int32 for logits [R, V]: argmax of logits (temperature 0) or of logits / T + noise."""
    return gumbel_partial(seed, logits, temperature)[1]
