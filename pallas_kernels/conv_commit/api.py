"""The public commit conv-history update: one contract (reference.conv_commit), two implementations.

| implementation     | what                                                    | where by default |
| ------------------ | ------------------------------------------------------- | ---------------- |
| "pallas_triton"    | one kernel for every layer, in place, Triton lowering   | never (opt-in)   |
| "reference"        | jnp: a gather a layer (XLA copies each history first)   | everywhere       |
| "pallas_interpret" | the kernel's body run by the CPU interpreter            | never (tests)    |

JAXSPEC_CONV_COMMIT (read when the model is traced) forces one. The kernel is opt-in until it has been timed on a
GPU in a whole round (it was written in session 76; its CPU tests run it in interpret mode and lower it to Triton
for an abstract H200). Under a mesh it runs per shard (jaxspec/sharding.py per_shard_conv_commit).
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.conv_commit import pallas_triton, reference

ENV_VAR = "JAXSPEC_CONV_COMMIT"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(implementation: str | None = None) -> str:
    """The implementation the model's commit runs."""
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "reference", implementation)


def conv_commit(hists, conv_ins, win, keep, *, implementation: str | None = None):
    """See reference.conv_commit. Arguments of other shapes are refused (reference.check_args); an empty batch or
    history gives the reference's result, whatever the implementation."""
    reference.check_args(hists, conv_ins, win, keep)
    name = resolve(implementation)
    if name == "reference" or 0 in hists[0].shape:     # the kernel's grid needs rows and channels
        return reference.conv_commit(hists, conv_ins, win, keep)
    return pallas_triton.conv_commit(tuple(hists), tuple(conv_ins), win, keep, interpret=name == "pallas_interpret")
