"""The public GDN decode step: one contract (reference.gdn_decode), two implementations.

| implementation     | what                                                     | where by default |
| ------------------ | -------------------------------------------------------- | ---------------- |
| "pallas_triton"    | one fused kernel per layer, Triton lowering               | never (opt-in)   |
| "reference"        | jaxspec/model.py's general tree path (the jnp spec)       | everywhere       |
| "pallas_interpret" | the kernel's body run by the CPU interpreter              | never (tests)    |

Opt-in through JAXSPEC_GDN_DECODE (read when the model is traced). It passed its CPU tests (interpret
mode, the Triton lowering for an abstract H200) and its GPU tests on the H200, and in the model it runs
in 6.5 us a layer (0.31 ms of the 64-layer AR step's kernels). But the AR round did not get shorter:
15.40 / 15.43 ms without it, 15.36 ms with it (one H200, real shape, 1K context;
bench/results/2026-11-30-h200-kernel-flags). The step without the flag was not profiled in the same
session, so what XLA's path costs today is not known. So it is not the default. "reference" leaves the model
on its general path (`GatedDeltaNet.__call__` for any tree), of which reference.py is the one-node case.
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.gdn_decode import pallas_triton, reference

ENV_VAR = "JAXSPEC_GDN_DECODE"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(implementation: str | None = None) -> str:
    """The implementation the model's one-token GDN step runs."""
    default = "pallas_triton" if dispatch.on_gpu() else "reference"
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, default, implementation)


def gdn_decode(conv_in, history, conv_w, z, a, b, A_log, dt_bias, norm_w, s0, *, eps: float,
               implementation: str | None = None):
    """See reference.gdn_decode."""
    name = resolve(implementation)
    args = (conv_in, history, conv_w, z, a, b, A_log, dt_bias, norm_w, s0)
    if name == "reference":
        return reference.gdn_decode(*args, eps=eps)
    return pallas_triton.gdn_decode(*args, eps=eps, interpret=name == "pallas_interpret")
