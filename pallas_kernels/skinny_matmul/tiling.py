"""What the skinny matmul's two kernels (pallas_triton.py, pallas_mosaic.py) share: the sizes they take and the
H200 facts their tiles are chosen for."""

from __future__ import annotations

NUM_SMS = 132          # H200
SMEM_BYTES = 232448    # H200 shared memory a block may take (what Triton's launch reported as available)
SM_SMEM_BYTES = 233472  # H200 shared memory of one SM (228 KiB), shared by the blocks resident on it
BLOCK_RESERVED = 1024   # shared memory the runtime keeps per resident block
MAX_ROWS = 128
BLOCK = 64             # K and N must be multiples of this (the smallest tile side)


def default_split_k(column_blocks: int, k: int, block_k: int) -> int:
    """K slices, doubling while each stays a whole number of block_k tiles, until the column blocks times the
    slices give about two programs per SM."""
    split_k = 1
    while column_blocks * split_k < 2 * NUM_SMS and k % (block_k * split_k * 2) == 0:
        split_k *= 2
    return split_k


def one_wave_split_k(column_blocks: int, k: int, block_k: int) -> int:
    """K slices, doubling while each stays a whole number of block_k tiles and the column blocks times the slices
    stay within one block per SM: one wave of blocks that all end together (the Mosaic GPU kernel's default)."""
    split_k = 1
    while column_blocks * split_k * 2 <= NUM_SMS and k % (block_k * split_k * 2) == 0:
        split_k *= 2
    return split_k


def resident_blocks(smem: int) -> int:
    """Blocks of `smem` bytes of shared memory each that the whole GPU holds at once (one wave)."""
    return NUM_SMS * (SM_SMEM_BYTES // (smem + BLOCK_RESERVED))
