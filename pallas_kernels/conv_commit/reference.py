"""The commit's conv-history update for every GDN layer at once (what `jaxspec.model.commit` does to each layer's
short-conv history after a verified block's accepted path).

A GDN layer's depthwise causal conv (kernel K) keeps the last K-1 pre-conv inputs of the committed sequence, its
history [B, K-1, C]. After a commit the history is the accepted path's last node's window: row r of the new history
is row win[b, r] of concat(history, conv_in) [B, K-1+N, C], the old history's rows first, then the block's nodes'
pre-conv inputs (jaxspec.model.window_rows gives win from the tree). A sequence not kept keeps its history.

XLA runs this as a gather a layer; because the new history replaces the old one in the engine's donated state
and is read from it, XLA also copies every history first (48 copies a round on Qwen3.6-27B, session 75).
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.dispatch import check_per_layer


def check_args(hists, conv_ins, win, keep) -> None:
    """ValueError naming the argument unless hists is a non-empty sequence of [B, K-1, C] arrays of one shape and
    dtype (one a layer), conv_ins as many [B, N, C] arrays of one dtype, win int32 [B, K-1] and keep bool [B]."""
    b, km1, c = check_per_layer("conv_commit", "hists", hists, "[B, K-1, C]", item=("history", "histories")).shape
    if len(conv_ins) != len(hists):
        raise ValueError(f"conv_commit: {len(conv_ins)} conv_ins for {len(hists)} hists (one each a layer)")
    x = conv_ins[0]
    if (x.ndim != 3 or x.shape[0] != b or x.shape[2] != c or not x.shape[1]
            or any(y.shape != x.shape or y.dtype != x.dtype for y in conv_ins)):
        raise ValueError(f"conv_commit: conv_ins must be [B, N, C] = [{b}, N >= 1, {c}] arrays of one shape and "
                         f"dtype, got {sorted({(tuple(y.shape), str(y.dtype)) for y in conv_ins})}")
    if win.shape != (b, km1) or win.dtype != jnp.int32:
        raise ValueError(f"conv_commit: win {win.shape} {win.dtype} must be int32 [B, K-1] = [{b}, {km1}]")
    if keep.shape != (b,) or keep.dtype != jnp.bool_:
        raise ValueError(f"conv_commit: keep {keep.shape} {keep.dtype} must be bool [B] = [{b}]")


def conv_commit(hists, conv_ins, win, keep):
    """hists: L histories [B, K-1, C]; conv_ins: L [B, N, C]; win [B, K-1] int32 rows of concat(history, conv_in)
    (indices past the end are clipped); keep [B] bool. Returns the L new histories (module docstring), in the
    histories' dtype (the rows pass through conv_in's dtype, as the conv reads them)."""
    check_args(hists, conv_ins, win, keep)
    out = []
    for h, x in zip(hists, conv_ins):
        ext = jnp.concatenate([h.astype(x.dtype), x], 1)
        rows = jnp.take_along_axis(ext, jnp.clip(win, 0, ext.shape[1] - 1)[..., None], 1).astype(h.dtype)
        out.append(jnp.where(keep[:, None, None], rows, h))
    return tuple(out)
