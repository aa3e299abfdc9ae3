"""The public GDN tree inputs (conv along the tree, silu, l2 norms, gates): one contract
(reference.gdn_tree_inputs), two implementations.

| implementation     | what                                                     | where by default |
| ------------------ | -------------------------------------------------------- | ---------------- |
| "pallas_triton"    | one kernel per layer, Triton lowering (pallas_triton.py)  | never (opt-in)   |
| "reference"        | jnp (reference.py)                                        | everywhere       |
| "pallas_interpret" | the kernel's body run by the CPU interpreter              | never (tests)    |

JAXSPEC_GDN_TREE_INPUTS (read when the model is traced) forces one. The kernel was written in session 42 after
that session's GPU time was spent: it has passed its CPU tests (interpret mode, the Triton lowering for an abstract
H200) but has not run on a GPU, so it is opt-in until its GPU tests and a verify profile say otherwise. Blocks
the kernel does not take (more than 128 nodes, head dims that are not powers of two >= 16) use the reference.
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.gdn_tree_inputs import pallas_triton, reference

ENV_VAR = "JAXSPEC_GDN_TREE_INPUTS"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(n: int, dk: int, dv: int, implementation: str | None = None) -> str:
    """The implementation the model's GDN layer runs for a block of n nodes."""
    name = dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "reference", implementation)
    if name != "reference" and implementation is None and not pallas_triton.supports(n, dk, dv):
        return "reference"
    return name


def gdn_tree_inputs(y, history, conv_w, A_log, dt_bias, rows, *, dk: int, dv: int,
                    implementation: str | None = None):
    """See reference.gdn_tree_inputs."""
    name = resolve(y.shape[1], dk, dv, implementation)
    args = (y, history, conv_w, A_log, dt_bias, rows)
    if name == "reference":
        return reference.gdn_tree_inputs(*args, dk=dk, dv=dv)
    return pallas_triton.gdn_tree_inputs(*args, dk=dk, dv=dv, interpret=name == "pallas_interpret")
