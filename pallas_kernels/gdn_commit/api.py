"""The public commit GDN state update: one contract (reference.gdn_commit), two implementations.

| implementation     | what                                                   | where by default |
| ------------------ | ------------------------------------------------------ | ---------------- |
| "pallas_triton"    | one kernel for every layer, Triton lowering            | GPU (*)          |
| "reference"        | jnp: one contraction, then a fusion a layer (XLA)      | elsewhere        |
| "pallas_interpret" | the kernel's body run by the CPU interpreter           | never (tests)    |

JAXSPEC_GDN_COMMIT (read when the model is traced) forces one. The kernel passed its 3 GPU tests on an H100, where
it took the update after a path of 16 from 328.6 to 176.1 us (bench.py, session 75:
bench/results/2026-12-07-h100-s75/call3/). The GPU default since session 76: on an H200 at 1K, in one lease, the
DFlash and DDTree(63) rounds were each 0.14 ms shorter with it (medians of queued calls; 0.08-0.26 ms by every
measure), and the engine's GPU tests passed with it (bench/results/2026-12-07-h200-s76/). Under a mesh the kernel
runs per shard (jaxspec/sharding.py per_shard_commit).

(*) Head dims the kernel does not take (not powers of two >= 16), paths of more than 64 nodes and an AR step's path
of one run the reference unless `implementation=` names the kernel, which then refuses the first two.
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.gdn_commit import pallas_triton, reference

ENV_VAR = "JAXSPEC_GDN_COMMIT"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(implementation: str | None = None, dk: int | None = None, dv: int | None = None, p: int = 1) -> str:
    """The implementation the model's commit runs; for head dims or a path length (p nodes) the kernel does not
    take, and for an AR step's path of one node (XLA's update took 122.7 us there against the kernel's 165.0 on an
    H100, session 75), the reference unless `implementation` names the kernel."""
    default = "pallas_triton" if dispatch.on_gpu() else "reference"
    name = dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, default, implementation)
    if (name != "reference" and implementation is None and None not in (dk, dv)
            and (p < 2 or not pallas_triton.supports(dk, dv, p))):
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
