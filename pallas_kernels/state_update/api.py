"""The public commit-time GDN state update of one layer: one contract (reference.state_update), two
implementations.

| implementation     | what                                                      | where by default |
| ------------------ | --------------------------------------------------------- | ---------------- |
| "pallas_triton"    | one kernel per layer, Triton lowering (pallas_triton.py)   | nowhere yet      |
| "reference"        | jnp: jaxspec/model.py's commit forms every layer's update  | everywhere       |
|                    | in one product (tree_delta_rule.reference.states_at)       |                  |
| "pallas_interpret" | the kernel's body run by the CPU interpreter              | never (tests)    |

JAXSPEC_STATE_UPDATE (read when commit is traced) forces one. The kernel was written in session 44 after that
session's GPU time was spent: it is opt-in until it has run on a GPU (bench/next/k_state_update.sh). Head dims
the kernel does not take (not powers of two >= 16) use the reference.
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.state_update import pallas_triton, reference

ENV_VAR = "JAXSPEC_STATE_UPDATE"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(dk: int, dv: int, implementation: str | None = None) -> str:
    """The implementation commit runs for head dims dk, dv."""
    name = dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "reference", implementation)
    if name != "reference" and implementation is None and not pallas_triton.supports(dk, dv):
        return "reference"
    return name


def state_update(s0, k, delta, G, anc_row, last, keep, implementation: str | None = None):
    """See reference.state_update."""
    name = resolve(s0.shape[2], s0.shape[3], implementation)
    args = (s0, k, delta, G, anc_row, last, keep)
    if name == "reference":
        return reference.state_update(*args)
    return pallas_triton.state_update(*args, interpret=name == "pallas_interpret")
