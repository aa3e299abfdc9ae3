"""The public pass of top-p's threshold search: one contract (reference.mass_above), two implementations.

| implementation     | what                                                         | where by default |
| ------------------ | ------------------------------------------------------------ | ---------------- |
| "pallas_triton"    | one read of each row a pass, Triton lowering (pallas_triton) | on a GPU         |
| "reference"        | jnp, a [R, W, V] reduction (what jaxspec.sampling ran)       | elsewhere        |
| "pallas_interpret" | the kernel's body run by the CPU interpreter                 | never (tests)    |

The GPU default since session 56: with it, sampled rounds with top-p alone (0.7, 0, 0.9) at 1K, real shape, took
DDTree(63) 27.80 against 28.75 ms, DFlash 24.38 against 24.80, the AR loop 18.79 against 18.83 (means of two, one
lease on an H100, bench/results/2026-12-05-h100-s56/nucleus-rounds/), and its GPU tests passed there. The search
alone (16 ways, 9 passes, V = 248,320) took 0.26 / 0.81 ms at 15 / 64 rows with it against 0.37 / 1.23 with the
reference (bench/results/2026-12-05-h100-s55/nucleus/, `bench/next/k_nucleus.py`). Under a mesh jaxspec.sampling
runs the reference, whose sum spans the vocabulary's shards.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels import dispatch
from pallas_kernels.nucleus_mass import pallas_triton, reference

ENV_VAR = "JAXSPEC_NUCLEUS_MASS"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(implementation: str | None = None) -> str:
    default = "pallas_triton" if dispatch.on_gpu() else "reference"
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, default, implementation)


def mass_above(key, e, t, *, implementation: str | None = None, **tuning):
    """See reference.mass_above: key [..., V] uint32, e [..., V] float32, t [..., W] uint32 -> [..., W] float32.
    `tuning` (block_v, splits, num_warps) goes to the kernel. No rows, V = 0 or W = 0: the reference."""
    name = resolve(implementation)
    check_args(key, e, t)
    if name == "reference" or key.size == 0 or t.shape[-1] == 0:
        return reference.mass_above(key, e, t)
    lead, w = key.shape[:-1], t.shape[-1]
    wide = 1 << (w - 1).bit_length()                       # Triton's blocks are powers of two; pad with no mass
    rows = lambda a: a.reshape(-1, a.shape[-1])
    t = jnp.pad(rows(t), ((0, 0), (0, wide - w)), constant_values=jnp.uint32(0xFFFFFFFF))
    out = pallas_triton.mass_above(rows(key), rows(e), t, interpret=name == "pallas_interpret", **tuning)
    return out[:, :w].reshape(*lead, w)


def check_args(key, e, t):
    """ValueError naming the argument unless key [..., V] uint32, e float32 of key's shape, and t [..., W] uint32
    with key's leading shape (static: also under jit)."""
    if key.ndim < 1 or key.dtype != jnp.uint32:
        raise ValueError(f"mass_above: key {key.shape} {key.dtype} must be [..., V] uint32")
    if e.shape != key.shape or e.dtype != jnp.float32:
        raise ValueError(f"mass_above: e {e.shape} {e.dtype} must be float32 of key's shape {key.shape}")
    if t.ndim != key.ndim or t.shape[:-1] != key.shape[:-1] or t.dtype != jnp.uint32:
        raise ValueError(f"mass_above: t {t.shape} {t.dtype} must be [..., W] uint32 with the leading shape of "
                         f"key {key.shape}")
