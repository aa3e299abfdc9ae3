"""The public GDN decode step: one contract (reference.gdn_decode), two implementations.

| implementation     | what                                                     | where by default |
| ------------------ | -------------------------------------------------------- | ---------------- |
| "pallas_triton"    | one fused kernel per layer, Triton lowering               | GPU (*)          |
| "reference"        | jaxspec/model.py's general tree path (the jnp spec)       | elsewhere        |
| "pallas_interpret" | the kernel's body run by the CPU interpreter              | never (tests)    |

JAXSPEC_GDN_DECODE (read when the model is traced) forces one. The kernel passed its CPU tests (interpret mode,
the Triton lowering for an abstract H200) and its GPU tests on the H200. Alone it shortened the AR round little
(15.40 -> 15.36 ms, bench/results/2026-11-30-h200-kernel-flags). What made it the GPU default (session 39,
bench/results/2026-12-04-h200-s39): with it XLA treats the engine's AR loop as one convertible WHILE, which its
minimum graph size (5 thunks, the WHILE counted as one) had left out of any CUDA graph; with that minimum set to 1
on the loop's compile (jaxspec/engine.py, LOOP_GRAPH_OPTIONS) the AR loop went 13.54 -> 13.30 ms a round at 1K,
real shape, in one lease. "reference" leaves the model on its general path (`GatedDeltaNet.__call__` for any
tree), of which reference.py is the one-node case.

(*) Head dims the kernel does not take (not powers of two) run the reference unless `implementation=` names the
kernel (which then refuses them), as in gdn_tree_inputs; so does an empty batch.
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.gdn_decode import pallas_triton, reference

ENV_VAR = "JAXSPEC_GDN_DECODE"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(implementation: str | None = None, dk: int | None = None, dv: int | None = None) -> str:
    """The implementation the model's one-token GDN step runs; for head dims dk, dv the kernel does not take, the
    reference unless `implementation` names the kernel. Without dims (the model asking whether to take the fused
    step at all), the choice for head dims the kernel takes."""
    default = "pallas_triton" if dispatch.on_gpu() else "reference"
    name = dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, default, implementation)
    if name != "reference" and implementation is None and None not in (dk, dv) and not pallas_triton.supports(dk, dv):
        return "reference"
    return name


def gdn_decode(conv_in, history, conv_w, z, a, b, A_log, dt_bias, norm_w, s0, *, eps: float,
               implementation: str | None = None):
    """See reference.gdn_decode. Arguments of other shapes are refused (reference.check_args); an empty batch gives
    the reference's empty outputs, whatever the implementation."""
    args = (conv_in, history, conv_w, z, a, b, A_log, dt_bias, norm_w, s0)
    _, _, dk, dv = reference.check_args(*args)
    name = resolve(implementation, dk, dv)
    if name == "reference" or not conv_in.shape[0]:    # the kernel's grid and index maps need a sequence
        return reference.gdn_decode(*args, eps=eps)
    return pallas_triton.gdn_decode(*args, eps=eps, interpret=name == "pallas_interpret")
