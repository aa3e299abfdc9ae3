"""The public residual add + RMSNorm: one contract (reference.add_rms_norm), two implementations.

| implementation     | what                                              | where by default |
| ------------------ | ------------------------------------------------- | ---------------- |
| "pallas_triton"    | one kernel per call, Triton lowering               | never (opt-in)   |
| "reference"        | jnp, what the model always ran                     | everywhere       |
| "pallas_interpret" | the kernel's body run by the CPU interpreter       | never (tests)    |

Opt-in through JAXSPEC_ADD_RMS_NORM (read when the model is traced). Where a kernel is chosen, the model hands
it the K slices of the product in front (`slices_for`), for blocks of at most SLICE_ROWS rows and no mesh:
XLA splits those skinny products into slices and would otherwise sum them in a kernel of its own ahead of the
call. Its first form (the normalised row out, a program per row, a plain update) made the AR round longer:
15.91 ms against 15.40 / 15.43 without it (one H200, real shape, 1K context;
bench/results/2026-11-30-h200-kernel-flags), and on an H100 in session 78 it added 0.26-0.52 ms of kernels
to verify(16), verify(64) and the AR step at 1K (bench/results/2026-12-07-h100-s78/): 5.6 us a call against
the default's 2.1 + 1.9, a reduction XLA added after each product it fed, and the slices' sums ahead of it.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels import dispatch
from pallas_kernels.add_rms_norm import pallas_triton, reference

ENV_VAR = "JAXSPEC_ADD_RMS_NORM"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")
SLICES = 8          # K slices of the product in front: what XLA's split-K makes of them at 16 and 64 rows
SLICE_ROWS = 64     # (session 44's verify(16) HLO; session 78's verify(64) profile)


def resolve(implementation: str | None = None) -> str:
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "reference", implementation)


def slices_for(rows: int, implementation: str | None = None) -> int:
    """How many K slices the product in front of add_rms_norm should hand it for a block of `rows` rows (batch
    times nodes): SLICES where the kernel runs and rows <= SLICE_ROWS, else 0 (the product itself). The caller
    passes 0 under a mesh (the slices would be gathered across the model axis)."""
    return SLICES if resolve(implementation) != "reference" and 0 < rows <= SLICE_ROWS else 0


def add_rms_norm(x, u, w, *, eps: float, offset: float, implementation: str | None = None):
    """See reference.add_rms_norm: x [..., D], u [..., D] of x's dtype or its K slices [S, ..., D] (a float
    dtype), w [D] (`check_args`; the kernel writes x + u and h in x's dtype, r in fp32). No rows (or D = 0): the
    reference's empty outputs. A width the kernel would split in more than 64 chunks or a slice count that is not a
    power of two (`pallas_triton.supports`, e.g. an odd D) runs the reference, whatever the implementation."""
    name = resolve(implementation)
    check_args(x, u, w)
    slices = 1 if u.ndim == x.ndim else u.shape[0]
    if name == "reference" or x.size == 0 or not pallas_triton.supports(x.shape[-1], slices):  # size 0: no grid
        return reference.add_rms_norm(x, u, w, eps=eps, offset=offset)
    return pallas_triton.add_rms_norm(x, u, w, eps=eps, offset=offset, interpret=name == "pallas_interpret")


def check_args(x, u, w):
    """ValueError naming the argument unless x [..., D], u of x's shape and dtype or slices [S >= 1, ..., D] of a
    float dtype, w [D] (static: also under jit)."""
    if x.ndim < 1:
        raise ValueError(f"add_rms_norm: x {x.shape} must be [..., D]")
    if u.ndim == x.ndim + 1:
        if u.shape[1:] != x.shape or u.shape[0] < 1 or not jnp.issubdtype(u.dtype, jnp.floating):
            raise ValueError(f"add_rms_norm: u's slices {u.shape} {u.dtype} must be [S >= 1, *{x.shape}] of a float "
                             f"dtype for x {x.shape}")
    elif u.shape != x.shape or u.dtype != x.dtype:
        raise ValueError(f"add_rms_norm: u {u.shape} {u.dtype} must have the shape and dtype of x {x.shape} "
                         f"{x.dtype}, or be its slices [S, *{x.shape}]")
    if w.shape != x.shape[-1:]:
        raise ValueError(f"add_rms_norm: w {w.shape} must be [D] = {x.shape[-1:]} for x {x.shape}")
