"""The public residual add + RMSNorm: one contract (reference.add_rms_norm), two implementations.

| implementation     | what                                              | where by default |
| ------------------ | ------------------------------------------------- | ---------------- |
| "pallas_triton"    | one kernel per call, Triton lowering               | never (opt-in)   |
| "reference"        | jnp, what the model always ran                     | everywhere       |
| "pallas_interpret" | the kernel's body run by the CPU interpreter       | never (tests)    |

Opt-in through JAXSPEC_ADD_RMS_NORM (read when the model is traced). In its first form (the normalised row
out, the row scale applied) it made the AR round longer: 15.91 ms against 15.40 / 15.43 without it (one H200,
real shape, 1K context; bench/results/2026-11-30-h200-kernel-flags), and on an H100 in session 78 it added
0.26-0.52 ms of kernels to verify(16), verify(64) and the AR step at 1K (bench/results/2026-12-07-h100-s78/):
5.6 us a call against the default's 2.1 + 1.9, and a reduction XLA added after each product it fed. It now
has the deferred form's outputs (x + u, h, r), as the default path.
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.add_rms_norm import pallas_triton, reference

ENV_VAR = "JAXSPEC_ADD_RMS_NORM"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(implementation: str | None = None) -> str:
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "reference", implementation)


def add_rms_norm(x, u, w, *, eps: float, offset: float, implementation: str | None = None):
    """See reference.add_rms_norm: x, u [..., D] of one shape and dtype, w [D] (`check_args`; the kernel reads
    u row for row and w over D, and writes x + u and h in x's dtype, r in fp32). No rows (or D = 0): the reference's
    empty outputs. A width the kernel would walk in more than 64 chunks (`pallas_triton.supports`, e.g. an odd D)
    runs the reference, whatever the implementation."""
    name = resolve(implementation)
    check_args(x, u, w)
    if name == "reference" or x.size == 0 or not pallas_triton.supports(x.shape[-1]):  # x.size 0: an empty grid
        return reference.add_rms_norm(x, u, w, eps=eps, offset=offset)
    return pallas_triton.add_rms_norm(x, u, w, eps=eps, offset=offset, interpret=name == "pallas_interpret")


def check_args(x, u, w):
    """ValueError naming the argument unless x [..., D], u of x's shape and dtype, w [D] (static: also under jit)."""
    if x.ndim < 1:
        raise ValueError(f"add_rms_norm: x {x.shape} must be [..., D]")
    if u.shape != x.shape or u.dtype != x.dtype:
        raise ValueError(f"add_rms_norm: u {u.shape} {u.dtype} must have the shape and dtype of x {x.shape} {x.dtype}")
    if w.shape != x.shape[-1:]:
        raise ValueError(f"add_rms_norm: w {w.shape} must be [D] = {x.shape[-1:]} for x {x.shape}")
