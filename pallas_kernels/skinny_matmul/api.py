"""The public projection y = x @ w of jaxspec's Linear layers: one contract (reference.matmul), two
implementations.

| implementation     | what                                                           | where by default |
| ------------------ | -------------------------------------------------------------- | ---------------- |
| "reference"        | XLA's dot (reference.py)                                       | everywhere       |
| "pallas_triton"    | the weight-streaming kernel for 2..128 rows (pallas_triton.py) | never (opt-in)   |
| "pallas_interpret" | the kernel's body run by the CPU interpreter                    | never (tests)    |

Opt-in through JAXSPEC_SKINNY_MATMUL (read when the model is traced). Written after the 2026-11-30 H200
profiles showed XLA streaming the verify's 16- and 65-row products slower than the AR step's one-row
ones; CPU-tested (interpret mode) but not yet compiled or timed on a GPU, so not the default.
The kernel runs where it applies: 2..128 rows (all leading dims together), K and N multiples of 64, x and w
of one dtype, and no multi-device mesh (under tensor parallelism the weights are split and the partitioner cannot split a
kernel); everything else, the one-row decode step and the prefill included, keeps XLA's dot.
"""

from __future__ import annotations

import math

import jax

from pallas_kernels import dispatch
from pallas_kernels.skinny_matmul import pallas_triton, reference

ENV_VAR = "JAXSPEC_SKINNY_MATMUL"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret")


def resolve(implementation: str | None = None) -> str:
    """The implementation asked for (the kernel still runs only where `applies`)."""
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "reference", implementation)


def applies(x_shape, w_shape, same_dtype: bool = True) -> bool:
    """Whether the kernel takes x [..., K] @ w [K, N] here (x and w of one dtype: XLA's dot promotes mixed
    ones, the kernel would not)."""
    mesh = jax.sharding.get_abstract_mesh()
    return (same_dtype and pallas_triton.supports(math.prod(x_shape[:-1]), *w_shape)
            and (mesh.empty or mesh.size == 1))


def matmul(x, w, *, implementation: str | None = None):
    """x [..., K] @ w [K, N] -> [..., N] in x's dtype. See reference.matmul."""
    name = resolve(implementation)
    if name == "reference" or not applies(x.shape, w.shape, x.dtype == w.dtype):
        return reference.matmul(x, w)
    k, n = w.shape
    y = pallas_triton.matmul(x.reshape(-1, k), w, interpret=name == "pallas_interpret")
    return y.reshape(*x.shape[:-1], n)
