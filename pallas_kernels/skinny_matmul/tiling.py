"""What the skinny matmul's two kernels (pallas_triton.py, pallas_mosaic.py) share: the sizes they take and the
H200 facts their tiles are chosen for."""

from __future__ import annotations

NUM_SMS = 132          # H200
SMEM_BYTES = 232448    # H200 shared memory a block may take (what Triton's launch reported as available)
MAX_ROWS = 128
BLOCK = 64             # K and N must be multiples of this (the smallest tile side)


def default_split_k(column_blocks: int, k: int, block_k: int) -> int:
    """K slices, doubling while each stays a whole number of block_k tiles, until the column blocks times the
    slices give about two programs per SM."""
    split_k = 1
    while column_blocks * split_k < 2 * NUM_SMS and k % (block_k * split_k * 2) == 0:
        split_k *= 2
    return split_k
