"""The public commit conv-history update: one contract (reference.conv_commit), two implementations.

| implementation     | what                                                    | where by default |
| ------------------ | ------------------------------------------------------- | ---------------- |
| "pallas_triton"    | one kernel for every layer, in place, Triton lowering   | GPU              |
| "reference"        | jnp: a gather a layer (XLA copies each history first)   | elsewhere        |
| "pallas_interpret" | the kernel's body run by the CPU interpreter            | never (tests)    |

JAXSPEC_CONV_COMMIT (read when the model is traced) forces one. The kernel is the GPU default since session 77: on an
H100, accept + commit's kernels took 0.052 ms less with it after a verify of a chain of 16 (0.273 -> 0.221 ms, 70 ->
22 kernels) and of a tree of 64 (0.350 -> 0.298 ms), bench/results/2026-12-07-h100-s77/; on the H200 its GPU tests
passed and its op took 3.5 against 56.2 us (session 76), too little for the rounds' medians to show. Its own compile
took 11.3 s there (session 76's bench), which a round loop's first compile pays once (generate's compile cache keeps
it for later runs). Under a mesh it
runs per shard (jaxspec/sharding.py per_shard_conv_commit); a traced loss (`dispatch.differentiable()`) gets the
reference.
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.conv_commit import pallas_triton, reference

ENV_VAR = "JAXSPEC_CONV_COMMIT"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(implementation: str | None = None) -> str:
    """The implementation the model's commit runs."""
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "pallas_triton" if dispatch.on_gpu() else "reference",
                            implementation)


def conv_commit(hists, conv_ins, win, keep, *, implementation: str | None = None):
    """See reference.conv_commit. Arguments of other shapes are refused (reference.check_args); an empty batch or
    history gives the reference's result, whatever the implementation."""
    reference.check_args(hists, conv_ins, win, keep)
    name = resolve(implementation)
    if name == "reference" or 0 in hists[0].shape:     # the kernel's grid needs rows and channels
        return reference.conv_commit(hists, conv_ins, win, keep)
    return pallas_triton.conv_commit(tuple(hists), tuple(conv_ins), win, keep, interpret=name == "pallas_interpret")
