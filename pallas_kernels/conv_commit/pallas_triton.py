"""The commit's conv-history update for every GDN layer in ONE Pallas kernel (Triton lowering), in place. Same
contract as reference.py.

XLA gathers each layer's new history from concat(history, conv_in), and since the new history takes the old one's
buffer (the round loop donates the state) while reading it, it first copies every history: 48 gathers and 48
copies of ~1.1 us each a round on Qwen3.6-27B (session 75, bench/results/2026-12-07-h100-s75/call1/). Here a
program per (sequence, `block_c` channels, `per` layers) reads its K-1 rows of each new history (from the old
history or from conv_in, by win) before it writes any, and owns its channels, so the writes can go over the old
history (input_output_aliases: pass donated histories, or XLA copies them first).

The histories and conv_ins are separate arrays (the model unrolls its layers), so a program picks its layers by
branches on its grid index. Each array is read through its full, flattened ref ([B, rows * C]) at dynamic row
offsets: Triton's loads need power-of-two sizes, and K-1 rows (3 for Qwen3.6) is not one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.conv_commit.reference import check_args


def _kernel(win_ref, keep_ref, *refs, layers, per, km1, n, c, bc):
    h_refs, x_refs, out_refs = refs[:layers], refs[layers:2 * layers], refs[2 * layers:]
    b, c0, g = pl.program_id(0), pl.program_id(1) * bc, pl.program_id(2)
    kept = keep_ref[b] != 0
    idx = [win_ref[b, r] for r in range(km1)]
    for l in range(layers):

        @pl.when(g == l // per)
        def _(l=l):
            rows = []
            for r, i in enumerate(idx):     # every row read before any is written: the rows may move
                old = h_refs[l][b, pl.ds(r * c + c0, bc)]
                hv = h_refs[l][b, pl.ds(jnp.clip(i, 0, km1 - 1) * c + c0, bc)]
                xv = x_refs[l][b, pl.ds(jnp.clip(i - km1, 0, n - 1) * c + c0, bc)]
                new = jnp.where(i < km1, hv.astype(xv.dtype), xv).astype(old.dtype)
                rows.append(jnp.where(kept, new, old))
            for r, row in enumerate(rows):
                out_refs[l][b, pl.ds(r * c + c0, bc)] = row


def _pow2_divisor(n: int, at_most: int) -> int:
    """The largest power of two <= at_most that divides n."""
    d = 1
    while d * 2 <= at_most and n % (d * 2) == 0:
        d *= 2
    return d


@functools.partial(jax.jit, static_argnames=("interpret", "per", "block_c", "num_warps"))
def conv_commit(hists, conv_ins, win, keep, *, interpret=False, per=1, block_c=1024, num_warps=4):
    """Same contract as reference.conv_commit. The new histories are written over the old ones' buffers where the
    caller's jit donates them (the engine's round loop carries them); elsewhere XLA copies them first.

    per: layers a program (rounded down to a divisor of L); block_c: channels a program (rounded down to the
    largest power of two dividing C)."""
    check_args(hists, conv_ins, win, keep)
    hists, conv_ins = tuple(hists), tuple(conv_ins)
    layers = len(hists)
    b, km1, c = hists[0].shape
    n = conv_ins[0].shape[1]
    if block_c < 1 or per < 1:
        raise ValueError(f"conv_commit: block_c and per must be >= 1, got block_c={block_c}, per={per}")
    per = max(d for d in range(1, min(per, layers) + 1) if layers % d == 0)
    bc = _pow2_divisor(c, block_c)
    flat_h = tuple(h.reshape(b, km1 * c) for h in hists)       # row-major: free reshapes
    flat_x = tuple(x.reshape(b, n * c) for x in conv_ins)
    whole = pl.no_block_spec
    out = pl.pallas_call(
        functools.partial(_kernel, layers=layers, per=per, km1=km1, n=n, c=c, bc=bc),
        out_shape=tuple(jax.ShapeDtypeStruct(h.shape, h.dtype) for h in flat_h),
        grid=(b, c // bc, layers // per),
        in_specs=[whole] * (2 + 2 * layers),
        out_specs=tuple([whole] * layers),
        input_output_aliases={2 + i: i for i in range(layers)},
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="conv_commit",
    )(win, keep.astype(jnp.int32), *flat_h, *flat_x)
    return tuple(o.reshape(b, km1, c) for o in out)
