"""The public residual add + RMSNorm: one contract (reference.add_rms_norm), two implementations.

| implementation     | what                                              | where by default |
| ------------------ | ------------------------------------------------- | ---------------- |
| "pallas_triton"    | one kernel per call, Triton lowering               | never (yet)      |
| "reference"        | jnp, what the model always ran                     | everywhere       |
| "pallas_interpret" | the kernel's body run by the CPU interpreter       | never (tests)    |

Opt-in through JAXSPEC_ADD_RMS_NORM (read when the model is traced): CPU-tested (interpret mode, the
Triton lowering for an abstract H200), not yet run on a GPU.
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.add_rms_norm import pallas_triton, reference

ENV_VAR = "JAXSPEC_ADD_RMS_NORM"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(implementation: str | None = None) -> str:
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "reference", implementation)


def add_rms_norm(x, u, w, *, eps: float, offset: float, implementation: str | None = None):
    """See reference.add_rms_norm."""
    name = resolve(implementation)
    if name == "reference":
        return reference.add_rms_norm(x, u, w, eps=eps, offset=offset)
    return pallas_triton.add_rms_norm(x, u, w, eps=eps, offset=offset, interpret=name == "pallas_interpret")
