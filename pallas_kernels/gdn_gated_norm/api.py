"""The public GDN output gate (RMSNorm of the tree delta rule's output times silu(z)): one contract
(reference.gdn_gated_norm), two implementations.

| implementation     | what                                                     | where by default |
| ------------------ | -------------------------------------------------------- | ---------------- |
| "pallas_triton"    | one kernel per layer, Triton lowering (pallas_triton.py)  | never (opt-in)   |
| "reference"        | jnp (reference.py)                                        | everywhere       |
| "pallas_interpret" | the kernel's body run by the CPU interpreter              | never (tests)    |

JAXSPEC_GDN_GATED_NORM (read when the model is traced) forces one. The kernel was written in session 43 after that
session's GPU time was spent: it has passed its CPU tests (interpret mode, the Triton lowering for an abstract H200)
but has not run on a GPU, so it is opt-in until its GPU tests and a verify profile say otherwise. Value head dims
the kernel does not take (not a power of two >= 16) use the reference.
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.gdn_gated_norm import pallas_triton, reference

ENV_VAR = "JAXSPEC_GDN_GATED_NORM"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(dv: int, implementation: str | None = None) -> str:
    """The implementation the model's GDN layer runs for value heads of dv."""
    name = dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "reference", implementation)
    if name != "reference" and implementation is None and not pallas_triton.supports(dv):
        return "reference"
    return name


def gdn_gated_norm(o, y, norm_w, *, dk: int, eps: float, implementation: str | None = None):
    """See reference.gdn_gated_norm."""
    name = resolve(o.shape[-1], implementation)
    if name == "reference":
        return reference.gdn_gated_norm(o, y, norm_w, dk=dk, eps=eps)
    return pallas_triton.gdn_gated_norm(o, y, norm_w, dk=dk, eps=eps, interpret=name == "pallas_interpret")
