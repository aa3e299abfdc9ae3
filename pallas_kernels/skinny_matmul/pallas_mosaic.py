"""y = x @ w for a few rows as a weight-streaming Pallas kernel, Mosaic GPU lowering (Hopper: TMA copies into
shared memory, warpgroup MMA). Same contract as reference.matmul, for bf16 / f16.

Why a second kernel: the Triton one (pallas_triton.py) streams only 1.1-1.3 TB/s on the H200 at every tile
tried, where XLA does 3.6 TB/s at 16 rows, 3.1 at 64 and 2.5 at 65 (bench/results/2026-11-30-h200-s11-kernels,
-s11-rounds/rows.log); the verify of a 64-node tree spends most of its 21 ms in these products. Mosaic GPU is
JAX's Hopper backend and copies tiles with TMA, which the Triton lowering does not.

Layout: a grid of (N / block_n) column blocks x `split_k` slices of K, one warpgroup each. A block pipelines
its K slice in [block_k, block_n] tiles of w (and the matching [rows, block_k] tiles of x), `steps` copies in
flight, into one fp32 accumulator. Each block writes its fp32 partial through shared memory; XLA sums the
split_k partials. The weights are read once; x, a few hundred KB at most, is read by every column block
(from L2). Two forms of the product:
- `transposed=False`: acc [rows, block_n] += x_tile @ w_tile, rows = x's rows padded to 64 (a warpgroup
  MMA's least) or 128; the form of JAX's Hopper matmul example;
- `transposed=True`: acc [block_n, rows] += w_tile^T @ x_tile^T (both operands read transposed from shared
  memory), rows padded only to a multiple of 16: 16 rows move a quarter of the x tiles and hold a quarter
  of the accumulator; XLA transposes the [N, rows] result.

Tiles: one wave of one block per SM, 6 pipeline steps (`tiles`). Session 13 ran it at tiles aiming at two
blocks per SM: 2.0-3.4 TB/s, below XLA (bench/results/2026-11-30-h200x4-mosaic-matmul). Those tiles made 272 /
320 / 448 blocks where 264 fit at once: a second wave of a few blocks. Session 41's sweep of one-wave tiles
(bench/results/2026-12-04-h200-s41/) streamed 3.1-4.0 TB/s at 16 rows and beat XLA's dot alone on the narrow
products (down_proj, out_proj / o_proj, q|k|v; 16 and 64 rows), tying it on the 34816-wide MLP gate|up. Inside
the 27B model it did not: given those products, verify(16) took 15.95 ms of kernels against XLA's 15.88 and the
DFlash / DDTree(63) rounds 0.24-0.40 ms longer. So it stays opt-in (JAXSPEC_SKINNY_MATMUL=pallas_mosaic).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from pallas_kernels.skinny_matmul.tiling import BLOCK, MAX_ROWS, SMEM_BYTES, one_wave_split_k

DTYPES = (jnp.bfloat16, jnp.float16)


def supports(m: int, k: int, n: int, dtype) -> bool:
    """Whether the kernel takes these sizes and dtype (the api runs the reference otherwise)."""
    return 2 <= m <= MAX_ROWS and k % BLOCK == 0 and n % BLOCK == 0 and jnp.dtype(dtype) in map(jnp.dtype, DTYPES)


def padded_rows(m: int, transposed: bool = True) -> int:
    """x's rows as the kernel holds them: a multiple of 16 transposed, else 64 or 128."""
    return -(-m // 16) * 16 if transposed else (64 if m <= 64 else 128)


def smem_bytes(m: int, block_n: int, block_k: int, steps: int, itemsize: int = 2, transposed: bool = True) -> int:
    """Shared memory of one block: `steps` buffers of the x and w tiles, and the fp32 output tile."""
    rows = padded_rows(m, transposed)
    return steps * (rows * block_k + block_k * block_n) * itemsize + rows * block_n * 4


DEEPEST = 6     # pipeline steps the default tiles aim at (bench/results/2026-12-04-h200-s41/wave)


def tiles(m: int, k: int, n: int, block_n: int | None = None, block_k: int | None = None,
          split_k: int | None = None, steps: int | None = None, transposed: bool = True) -> tuple[int, int, int, int]:
    """(block_n, block_k, split_k, steps): the given ones, else one wave of one block per SM: 128-wide column
    blocks (64 when N is not a multiple of 128), 64-deep K tiles, the deepest pipeline up to DEEPEST steps that
    shared memory holds, and the most K slices that keep the blocks within the SMs (tiling.one_wave_split_k).
    Session 41 measured why: tiles aiming at two blocks per SM left a second, nearly empty wave (272 / 320 / 448
    blocks where 264 fit) and streamed 2.7-3.6 TB/s at 16 rows; one wave streamed 3.1-4.0."""
    block_n = block_n or (128 if n % 128 == 0 else 64)
    block_k = block_k or 64
    if n % block_n or k % block_k or block_n % BLOCK or block_k % BLOCK:
        raise ValueError(f"skinny matmul (mosaic): K={k}, N={n} must be multiples of block_k={block_k} and "
                         f"block_n={block_n}, themselves multiples of {BLOCK}")
    if steps is None:
        steps = next((s for s in range(DEEPEST, 2, -1)
                      if smem_bytes(m, block_n, block_k, s, transposed=transposed) <= SMEM_BYTES), 2)
    need = smem_bytes(m, block_n, block_k, steps, transposed=transposed)
    if need > SMEM_BYTES:
        raise ValueError(f"skinny matmul (mosaic): block_n={block_n}, block_k={block_k} x {steps} steps at {m} rows "
                         f"need {need} bytes of shared memory, more than the {SMEM_BYTES} a block has")
    if split_k is None:
        split_k = one_wave_split_k(n // block_n, k, block_k)
    if k % (block_k * split_k):
        raise ValueError(f"skinny matmul (mosaic): K={k} is not a multiple of block_k * split_k = {block_k * split_k}")
    return block_n, block_k, split_k, steps


def _swizzled(minor: int, dtype) -> tuple:
    """Shared-memory transforms of a tile whose minor dimension holds `minor` elements: the largest swizzle
    that fits it, tiled to match (what the MMA reads and TMA writes)."""
    itemsize = jnp.dtype(dtype).itemsize
    swizzle = plgpu.find_swizzle(minor * itemsize * 8)
    return plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle)


def _kernel(x_gmem, w_gmem, o_gmem, o_smem, *, block_n, block_k, k_steps, steps, transposed):
    rows = x_gmem.shape[0]
    j, s = lax.axis_index("n"), lax.axis_index("k")
    cols = pl.ds(j * block_n, block_n)
    ks = pl.ds(s * k_steps * block_k, k_steps * block_k)

    def with_acc(acc):
        def step(_, x_smem, w_smem):
            if transposed:
                plgpu.wgmma(acc, w_smem.transpose((1, 0)), x_smem.transpose((1, 0)))
            else:
                plgpu.wgmma(acc, x_smem, w_smem)
            plgpu.wgmma_wait(0)     # the tiles' buffers are released to the next copies after this step

        plgpu.emit_pipeline(
            step, grid=(k_steps,),
            in_specs=[plgpu.BlockSpec((rows, block_k), lambda i: (0, i), transforms=_swizzled(block_k, x_gmem.dtype)),
                      plgpu.BlockSpec((block_k, block_n), lambda i: (i, 0), transforms=_swizzled(block_n, w_gmem.dtype))],
            max_concurrent_steps=steps,
        )(x_gmem.at[:, ks], w_gmem.at[ks, cols])
        o_smem[...] = acc[...]

    pl.run_scoped(with_acc, plgpu.ACC(o_smem.shape, jnp.float32))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[s, cols] if transposed else o_gmem.at[s, :, cols])
    plgpu.wait_smem_to_gmem(0)


@functools.partial(jax.jit, static_argnames=("interpret", "block_n", "block_k", "split_k", "steps", "transposed"))
def matmul(x, w, *, interpret=False, block_n=None, block_k=None, split_k=None, steps=None, transposed=True):
    """Same contract as reference.matmul: x [M, K], w [K, N] of one 16-bit float dtype (2 <= M <= 128; K, N
    multiples of 64) -> [M, N] in x's dtype, products summed in fp32. Tiles: see `tiles`; `transposed`: which
    form of the product (module docstring; the transposed one streamed faster at 16 rows and as fast at 64).
    interpret: run under Mosaic GPU's interpreter (a CPU test)."""
    m, k = x.shape
    n = w.shape[1]
    if not supports(m, k, n, w.dtype) or x.dtype != w.dtype:
        raise ValueError(f"skinny matmul kernel (mosaic) takes 2..{MAX_ROWS} rows, K and N multiples of {BLOCK}, "
                         f"x and w of one dtype among bfloat16, float16; got x {x.shape} {x.dtype}, w {w.shape} {w.dtype}")
    block_n, block_k, split_k, steps = tiles(m, k, n, block_n, block_k, split_k, steps, transposed)
    rows = padded_rows(m, transposed)
    xp = jnp.pad(x, ((0, rows - m), (0, 0)))
    out_tile = (block_n, rows) if transposed else (rows, block_n)
    run = plgpu.kernel(
        functools.partial(_kernel, block_n=block_n, block_k=block_k, k_steps=k // split_k // block_k, steps=steps,
                          transposed=transposed),
        out_type=jax.ShapeDtypeStruct((split_k,) + ((n, rows) if transposed else (rows, n)), jnp.float32),
        grid=(n // block_n, split_k), grid_names=("n", "k"),
        scratch_types=[plgpu.SMEM(out_tile, jnp.float32, transforms=_swizzled(out_tile[1], jnp.float32))],
        interpret=plgpu.InterpretGPUParams() if interpret else None,
    )
    y = run(xp, w).sum(0)
    return (y[:, :m].T if transposed else y[:m]).astype(x.dtype)
