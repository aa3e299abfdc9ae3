"""The commit's GDN state update for every layer in ONE Pallas kernel (Triton lowering). Same contract as
reference.py.

XLA runs the reference as one contraction that writes every layer's update U (48 x 3.1 MB at the real shape),
then 48 fusions that read U and S0 back and write S1: ~600 MB and 49 kernels; 345 / 355 us after a chain of 16 /
a tree's path of 16 on an H100 (session 75, bench/results/2026-12-07-h100-s75/). Here a program per (sequence,
value head, `block_dv` value columns, `per` layers) reads each of its layers' S0 tile, the path's k and w * Delta
rows, and writes S1 over S0 (input_output_aliases: pass donated states, or XLA copies them first): ~300 MB, one
kernel. The prototype of this kernel (bench/next/k_commit_fused.py, at a18473d) took 198 us at the tree's
path with tf32x3 dots, 4 layers a program and 32 columns; its chain of 16 paid 48 transposes of k that XLA split
off the stack (270 us), which this kernel avoids by contracting k's node dim in the dot itself.

The states are separate arrays (the model unrolls its layers), so a program picks its layers by branches on its
grid index: the compiled code holds one dot per layer. Rows with keep False get w * Delta = 0 and e^G = 1, so S1
is S0 (bit for bit, but -0.0 read back as +0.0). The path is padded to 16 nodes (Triton's dot minimum) with
zero rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.gdn_commit.reference import check_args

PRECISIONS = {
    # three tf32 tensor-core passes: about fp32 accuracy (2.5e-7 of max |S1| at the real shape, session 75).
    "tf32x3": lax.DotAlgorithmPreset.TF32_TF32_F32_X3,
    # fp32 FMA dots: the reference's arithmetic, slower (271 against 198 us at the tree's path, session 75).
    "ieee": lax.Precision.HIGHEST,
}
TILE = 16
MAX_P = 64      # path nodes a program's dot contracts at most (a DDTree path is <= 16, a prefill block 64)


def supports(dk: int, dv: int, p: int = 1) -> bool:
    """Power-of-two head dims >= 16 (Triton's blocks and dots) and 1..MAX_P path nodes."""
    pow2 = lambda d: d >= TILE and d & (d - 1) == 0
    return pow2(dk) and pow2(dv) and 1 <= p <= MAX_P


def _kernel(*refs, layers, per, precision):
    s0_refs, (k_ref, wd_ref, eg_ref), out_refs = refs[:layers], refs[layers:layers + 3], refs[layers + 3:]
    g = pl.program_id(3)
    eg_all = eg_ref[...]                                   # [Lp] this head's e^G a layer (1 where not kept)
    lane = lax.broadcasted_iota(jnp.int32, eg_all.shape, 0)
    for l in range(layers):
        gi, j = divmod(l, per)

        @pl.when(g == gi)
        def _(l=l, j=j):
            e = jnp.sum(jnp.where(lane == l, eg_all, 0.0))
            u = lax.dot_general(k_ref[j], wd_ref[j], (((0,), (0,)), ((), ())), precision=precision,
                                preferred_element_type=jnp.float32)          # [P, Dk]^T [P, bdv]
            out_refs[l][...] = e * s0_refs[l][...] + u


def _per(layers: int, per: int) -> int:
    """The largest power of two <= per that divides the layer count (a program's layers)."""
    per = max(1, min(per, layers))
    while layers % per or per & (per - 1):
        per -= 1
    return per


@functools.partial(jax.jit, static_argnames=("interpret", "per", "block_dv", "num_warps", "precision"))
def gdn_commit(s0s, w, k, delta, eg, keep, *, interpret=False, per=4, block_dv=32, num_warps=4,
               precision="tf32x3"):
    """Same contract as reference.gdn_commit. S1 is written over S0's buffers where the caller's jit donates the
    states (the engine's round loop carries them); elsewhere XLA copies them first.

    per: layers a program (rounded down to a power of two dividing L); block_dv: value columns a program (a power
    of two >= 16, clipped to Dv); defaults from session 75's H100 sweep (per 4 / block_dv 32: 197.9 us at the
    tree's path, per 1: 201.0, block_dv 64: 220.0). precision: "tf32x3" or "ieee" for the compiled dot; interpret
    mode computes it in exact fp32 (XLA:CPU has no tf32)."""
    rep = check_args(s0s, w, k, delta, eg, keep)
    s0s = tuple(s0s)
    layers = len(s0s)
    b, h, dk, dv = s0s[0].shape
    if not supports(dk, dv, w.shape[2]):
        raise ValueError(f"gdn_commit kernel takes power-of-two head dims >= 16 and 1..{MAX_P} path nodes, got "
                         f"Dk={dk}, Dv={dv}, P={w.shape[2]}")
    if precision not in PRECISIONS:
        raise ValueError(f"gdn_commit: precision={precision!r}; expected one of {', '.join(PRECISIONS)}")
    if block_dv < TILE or block_dv & (block_dv - 1):
        raise ValueError(f"gdn_commit: block_dv must be a power of two >= {TILE}, got {block_dv}")
    f32 = jnp.float32
    bdv, per = min(block_dv, dv), _per(layers, per)
    p = w.shape[2]
    n_pad = max(TILE, pl.next_power_of_2(p))
    on = keep[None, :, None, None]
    wd = jnp.where(on[..., None], w[..., None] * delta.astype(f32), 0.0)                  # [L, B, P, H, Dv]
    wd = jnp.moveaxis(wd, 2, 3)                                                         # [L, B, H, P, Dv]
    kr = jnp.moveaxis(k.astype(f32), 2, 3)                                              # [L, B, Hk, P, Dk]
    if n_pad > p:       # zero rows: no update
        kr = jnp.pad(kr, [(0, 0)] * 3 + [(0, n_pad - p), (0, 0)])
        wd = jnp.pad(wd, [(0, 0)] * 3 + [(0, n_pad - p), (0, 0)])
    lp = pl.next_power_of_2(layers)
    e = jnp.moveaxis(jnp.where(keep[None, :, None], eg.astype(f32), 1.0), 0, 2)        # [B, H, L]
    e = jnp.pad(e, [(0, 0), (0, 0), (0, lp - layers)], constant_values=1.0)
    tile = pl.BlockSpec((None, None, dk, bdv), lambda bi, hi, vi, gi: (bi, hi, 0, vi))
    in_specs = [tile] * layers + [
        pl.BlockSpec((per, None, None, n_pad, dk), lambda bi, hi, vi, gi: (gi, bi, hi // rep, 0, 0)),
        pl.BlockSpec((per, None, None, n_pad, bdv), lambda bi, hi, vi, gi: (gi, bi, hi, 0, vi)),
        pl.BlockSpec((None, None, lp), lambda bi, hi, vi, gi: (bi, hi, 0))]
    return pl.pallas_call(
        functools.partial(_kernel, layers=layers, per=per,
                          precision=lax.Precision.HIGHEST if interpret else PRECISIONS[precision]),
        out_shape=tuple(jax.ShapeDtypeStruct(s.shape, f32) for s in s0s),
        grid=(b, h, dv // bdv, layers // per),
        in_specs=in_specs,
        out_specs=tuple([tile] * layers),
        input_output_aliases={i: i for i in range(layers)},
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="gdn_commit",
    )(*s0s, kr, wd, e)
