"""y = x @ w for a few rows (the 16 or 65 nodes a verify sends through each projection) as a
weight-streaming Pallas kernel, Triton lowering. Same contract as reference.matmul.

At 16 and 65 rows every projection of the 27B model is bound by its weight bytes, yet XLA's choices
stream them slower than for one row: in the 16-layer rounds on the H200 the MLP's gate/up product took
1.38 ms a round at one row (Triton gemm fusion, 4.1 TB/s), 1.87 ms at 16 rows and ~2.1 ms at 65
(cuBLAS nvjet), bench/results/2026-11-30-h200-s10-xla-flags-tdr-sweep. Here every weight byte is read
once, in tiles of [block_k, block_n], by a grid of (N / block_n) column blocks x `split_k` slices of K;
the rows (padded to a power of two >= 16, Triton's smallest dot) ride along. Each program accumulates
its [rows, block_n] tile in fp32 over its K slice (a loop Triton pipelines, `num_stages` deep) and
writes it; the split_k partials are summed by XLA (rows x N x split_k fp32, a few MB at most).

Measured on the H200 (bench/results/2026-11-30-h200-s11-kernels): it streams 1.1-1.3 TB/s at every tile,
split and warp count tried, where XLA does 3.6 (16 rows) and 2.5 (65 rows); the 16-layer DFlash round
went 6.65 -> 7.04 ms with it and DDTree(64) 9.31 -> 10.76. So it stays opt-in
(JAXSPEC_SKINNY_MATMUL=pallas_triton) until the cause of that ceiling is found. What XLA does instead:
64 rows 3.1 TB/s, 65 rows 2.5 (a cuBLAS cliff), so a DDTree budget of 63 (a 64-row verify) beats 64.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.skinny_matmul.tiling import BLOCK, MAX_ROWS, SMEM_BYTES, default_split_k



def supports(m: int, k: int, n: int) -> bool:
    """Whether the kernel takes these sizes (the api runs the reference otherwise)."""
    return 2 <= m <= MAX_ROWS and k % BLOCK == 0 and n % BLOCK == 0


def _pow2_at_least_16(x: int) -> int:
    return max(16, 1 << (x - 1).bit_length())


def smem_bytes(m: int, block_n: int, block_k: int, itemsize: int, num_stages: int) -> int:
    """Shared memory of one program: `num_stages` buffers of the x and w tiles (the rows padded)."""
    return num_stages * (_pow2_at_least_16(m) + block_n) * block_k * itemsize


def tiles(m: int, k: int, n: int, block_n: int | None = None, block_k: int | None = None,
          split_k: int | None = None, itemsize: int = 2, num_stages: int = 3) -> tuple[int, int, int]:
    """(block_n, block_k, split_k) for these sizes: the given ones, else 128-wide column blocks (64 when
    N is not a multiple of 128), 128-deep K tiles (64 likewise, and 64 where 128 would not fit the shared
    memory: fp32 at 65..128 rows), and enough K slices for about two programs per SM, each slice a whole
    number of K tiles."""
    block_n = block_n or (128 if n % 128 == 0 else 64)
    if block_k is None:
        block_k = 128 if k % 128 == 0 else 64
        if smem_bytes(m, block_n, block_k, itemsize, num_stages) > SMEM_BYTES:
            block_k = 64
    need = smem_bytes(m, block_n, block_k, itemsize, num_stages)
    if need > SMEM_BYTES:
        raise ValueError(f"skinny matmul: tiles block_n={block_n}, block_k={block_k} x {num_stages} stages at "
                         f"{m} rows need {need} bytes of shared memory, more than the {SMEM_BYTES} a block has")
    if n % block_n or k % block_k:
        raise ValueError(f"skinny matmul: K={k}, N={n} are not multiples of block_k={block_k}, block_n={block_n}")
    if split_k is None:
        split_k = default_split_k(n // block_n, k, block_k)
    if k % (block_k * split_k):
        raise ValueError(f"skinny matmul: K={k} is not a multiple of block_k * split_k = {block_k * split_k}")
    return block_n, block_k, split_k


def _kernel(x_ref, w_ref, o_ref, *, block_k, precision):
    rows, block_n = o_ref.shape

    def step(i, acc):
        ks = pl.ds(pl.multiple_of(i * block_k, block_k), block_k)
        return acc + lax.dot_general(x_ref[:, ks], w_ref[ks, :], (((1,), (0,)), ((), ())), precision=precision,
                                     preferred_element_type=jnp.float32)

    o_ref[...] = lax.fori_loop(0, x_ref.shape[1] // block_k, step, jnp.zeros((rows, block_n), jnp.float32))


@functools.partial(jax.jit, static_argnames=("interpret", "block_n", "block_k", "split_k", "num_warps",
                                             "num_stages"))
def matmul(x, w, *, interpret=False, block_n=None, block_k=None, split_k=None, num_warps=4, num_stages=3):
    """Same contract as reference.matmul: x [M, K], w [K, N] (2 <= M <= 128; K, N multiples of 64) -> [M, N]
    in x's dtype. bf16 products are exact in the tensor cores and summed in fp32; fp32 inputs use
    full-precision dots (no tf32). Tiles: see `tiles` (None: its defaults)."""
    m, k = x.shape
    n = w.shape[1]
    if not supports(m, k, n):
        raise ValueError(f"skinny matmul kernel takes 2..{MAX_ROWS} rows and K, N multiples of {BLOCK}; "
                         f"got x {x.shape}, w {w.shape}")
    block_n, block_k, split_k = tiles(m, k, n, block_n, block_k, split_k, jnp.dtype(w.dtype).itemsize, num_stages)
    rows = _pow2_at_least_16(m)
    xp = jnp.pad(x.astype(w.dtype), ((0, rows - m), (0, 0)))
    ks = k // split_k
    precision = lax.Precision.HIGHEST if w.dtype == jnp.float32 else lax.Precision.DEFAULT
    parts = pl.pallas_call(
        functools.partial(_kernel, block_k=block_k, precision=precision),
        out_shape=jax.ShapeDtypeStruct((split_k, rows, n), jnp.float32),
        grid=(n // block_n, split_k),
        in_specs=[pl.BlockSpec((rows, ks), lambda j, s: (0, s)),
                  pl.BlockSpec((ks, block_n), lambda j, s: (s, j))],
        out_specs=pl.BlockSpec((None, rows, block_n), lambda j, s: (s, 0, j)),
        compiler_params=pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="skinny_matmul",
    )(xp, w)
    return parts.sum(0)[:m].astype(x.dtype)
