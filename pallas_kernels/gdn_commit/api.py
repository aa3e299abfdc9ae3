"""The public commit GDN state update: one contract (reference.gdn_commit), two implementations.

| implementation     | what                                                   | where by default |
| ------------------ | ------------------------------------------------------ | ---------------- |
| "pallas_triton"    | one kernel for every layer, Triton lowering            | never (opt-in)   |
| "reference"        | jnp: one contraction, then a fusion a layer (XLA)      | everywhere       |
| "pallas_interpret" | the kernel's body run by the CPU interpreter           | never (tests)    |

JAXSPEC_GDN_COMMIT (read when the model is traced) forces one. The kernel is opt-in: its CPU tests pass (interpret
mode, the Triton lowering for an abstract H200), and its prototype took the update from 355 to 198 us on an H100
(session 75), but it has not run its GPU tests, nor been timed in a whole round on the H200. Under a mesh the
kernel runs per shard (jaxspec/sharding.py per_shard_commit). Head dims the kernel does not take (not powers of
two >= 16) and paths of more than 64 nodes run the reference unless `implementation=` names the kernel, which
then refuses them.
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.gdn_commit import pallas_triton, reference

ENV_VAR = "JAXSPEC_GDN_COMMIT"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(implementation: str | None = None, dk: int | None = None, dv: int | None = None, p: int = 1) -> str:
    """The implementation the model's commit runs; for head dims or a path length (p nodes) the kernel does not
    take, the reference unless `implementation` names the kernel."""
    name = dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "reference", implementation)
    if (name != "reference" and implementation is None and None not in (dk, dv)
            and not pallas_triton.supports(dk, dv, p)):
        return "reference"
    return name


def gdn_commit(s0s, w, k, delta, eg, keep, *, implementation: str | None = None):
    """See reference.gdn_commit. Arguments of other shapes are refused (reference.check_args); an empty batch gives
    the reference's result (the states as they were), whatever the implementation."""
    reference.check_args(s0s, w, k, delta, eg, keep)
    _, _, dk, dv = s0s[0].shape
    name = resolve(implementation, dk, dv, w.shape[2])
    if name == "reference" or not s0s[0].shape[0] or not s0s[0].shape[1]:   # the kernel's grid needs rows
        return reference.gdn_commit(s0s, w, k, delta, eg, keep)
    return pallas_triton.gdn_commit(tuple(s0s), w, k, delta, eg, keep, interpret=name == "pallas_interpret")
