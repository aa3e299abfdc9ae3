"""The public GDN tree inputs (conv along the tree, silu, l2 norms, gates): one contract
(reference.gdn_tree_inputs), two implementations.

| implementation     | what                                                       | where by default           |
| ------------------ | ---------------------------------------------------------- | -------------------------- |
| "pallas_triton"    | one kernel per layer, Triton lowering (pallas_triton.py)    | GPU, blocks of 2..64 nodes |
| "reference"        | jnp (reference.py)                                          | everywhere else            |
| "pallas_interpret" | the kernel's body run by the CPU interpreter                | never (tests)              |

JAXSPEC_GDN_TREE_INPUTS (read when the model is traced) forces one. On the H200 (session 43,
bench/results/2026-12-04-h200-s43/inputs-second-form/) the kernel made verify's kernels 0.14 ms shorter at a chain
of 16 and 0.45 ms at a tree of 64 (the non-product kernels 0.14 / 0.26 ms) than XLA's fusions of the reference, in
one lease. Blocks of 65..128 nodes pad to 128 and were not measured in verify (25 us a layer alone, against 11 at
64), so they stay on the reference by default.
One node is the GDN decode kernel's (pallas_kernels/gdn_decode). Blocks the kernel does not take (more than 128
nodes, head dims that are not powers of two >= 16) use the reference.
"""

from __future__ import annotations

from pallas_kernels import dispatch
from pallas_kernels.gdn_tree_inputs import pallas_triton, reference

ENV_VAR = "JAXSPEC_GDN_TREE_INPUTS"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")
GPU_DEFAULT_MAX_N = 64     # the largest block measured faster than the reference in verify (session 43)


def resolve(n: int, dk: int, dv: int, implementation: str | None = None) -> str:
    """The implementation the model's GDN layer runs for a block of n nodes."""
    default = "pallas_triton" if dispatch.on_gpu() and 2 <= n <= GPU_DEFAULT_MAX_N else "reference"
    name = dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, default, implementation)
    if name != "reference" and implementation is None and not pallas_triton.supports(n, dk, dv):
        return "reference"
    return name


def gdn_tree_inputs(y, history, conv_w, A_log, dt_bias, rows, *, dk: int, dv: int,
                    implementation: str | None = None):
    """See reference.gdn_tree_inputs. Arguments of other shapes are refused (reference.layout); an empty block (B or
    N 0) gives the reference's empty outputs, whatever the implementation."""
    args = (y, history, conv_w, A_log, dt_bias, rows)
    reference.layout(*args, dk, dv)
    name = resolve(y.shape[1], dk, dv, implementation)
    if name == "reference" or not y.shape[0] * y.shape[1]:    # the kernel's grid needs a sequence, it refuses N = 0
        return reference.gdn_tree_inputs(*args, dk=dk, dv=dv)
    return pallas_triton.gdn_tree_inputs(*args, dk=dk, dv=dv, interpret=name == "pallas_interpret")
