"""The public projection y = x @ w of jaxspec's Linear layers: one contract (reference.matmul), three
implementations.

| implementation     | what                                                                  | where by default |
| ------------------ | --------------------------------------------------------------------- | ---------------- |
| "reference"        | XLA's dot (reference.py)                                              | everywhere       |
| "pallas_triton"    | the weight-streaming kernel for 2..128 rows, Triton (pallas_triton.py) | never (opt-in)   |
| "pallas_interpret" | that kernel's body run by the CPU interpreter                         | never (tests)    |
| "pallas_mosaic"    | the same for bf16 / f16 in Mosaic GPU: TMA + warpgroup MMA (pallas_mosaic.py) | never (opt-in) |

Opt-in through JAXSPEC_SKINNY_MATMUL (read when the model is traced). Written after the 2026-11-30 H200
profiles showed XLA streaming the verify's 16- and 65-row products slower than the AR step's one-row
ones. The Triton kernel streamed only 1.1-1.3 TB/s on the H200 (XLA: 2.5-3.6). The Mosaic GPU one, with
one-wave tiles, beat XLA's dot alone on the narrow products, but not inside the 27B model (its rounds were
0.24-0.40 ms longer with it: bench/results/2026-12-04-h200-s41/); see pallas_mosaic.py.
A kernel runs where it applies: 2..128 rows (all leading dims together), K and N multiples of 64, x and w
of one dtype (Mosaic: 16-bit floats), and no multi-device mesh (under tensor parallelism the weights are
split and the partitioner cannot split a kernel); everything else, the one-row decode step and the
prefill included, keeps XLA's dot.
"""

from __future__ import annotations

import math

import jax

from pallas_kernels import dispatch
from pallas_kernels.skinny_matmul import pallas_mosaic, pallas_triton, reference

ENV_VAR = "JAXSPEC_SKINNY_MATMUL"
IMPLEMENTATIONS = ("pallas_triton", "reference", "pallas_interpret", "pallas_mosaic")


def resolve(implementation: str | None = None) -> str:
    """The implementation asked for (the kernel still runs only where `applies`)."""
    return dispatch.resolve(ENV_VAR, IMPLEMENTATIONS, "reference", implementation)


def applies(x_shape, w_shape, same_dtype: bool = True, implementation: str = "pallas_triton", dtype=None) -> bool:
    """Whether that kernel takes x [..., K] @ w [K, N] here (x and w of one dtype: XLA's dot promotes mixed
    ones, the kernel would not; `dtype`, theirs, for the Mosaic kernel)."""
    mesh = jax.sharding.get_abstract_mesh()
    m = math.prod(x_shape[:-1])
    fits = (pallas_mosaic.supports(m, *w_shape, dtype) if implementation == "pallas_mosaic"
            else pallas_triton.supports(m, *w_shape))
    return same_dtype and fits and (mesh.empty or mesh.size == 1)


def matmul(x, w, *, implementation: str | None = None):
    """x [..., K] @ w [K, N] -> [..., N] in their dtype (mixed dtypes: their promotion, through the reference). See
    reference.matmul. Other shapes: ValueError."""
    name = resolve(implementation)
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[0]:
        raise ValueError(f"skinny matmul: x {x.shape} @ w {w.shape} needs x [..., K] and w [K, N] of one K")
    if name == "reference" or not applies(x.shape, w.shape, x.dtype == w.dtype, name, w.dtype):
        return reference.matmul(x, w)
    k, n = w.shape
    if name == "pallas_mosaic":
        y = pallas_mosaic.matmul(x.reshape(-1, k), w)
    else:
        y = pallas_triton.matmul(x.reshape(-1, k), w, interpret=name == "pallas_interpret")
    return y.reshape(*x.shape[:-1], n)
