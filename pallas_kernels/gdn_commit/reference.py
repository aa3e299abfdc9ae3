"""The commit's GDN state update for every GDN layer at once (what `jaxspec.model.commit` folds into the state
after a verified block's accepted path).

For layer l, sequence b and value head h, with the accepted path's nodes p (at most P of them):

    S1 = e^{G_a} S0 + sum_p w_p k_p Delta_p^T     where keep[b], else S1 = S0

w_p = e^{G_a - G_p} for the path's nodes (0 for slots that are not on it), G_a the path's last node's cumulative
log-decay, k_p the node's key at the value head's key head (h // (H / Hk)) and Delta_p its write
(tree_delta_rule/reference.py gives all three per node). This is the jnp form XLA has always run: one
contraction for every layer's update U, then e^G S0 + U a layer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.dispatch import check_per_layer

_HI = jax.lax.Precision.HIGHEST


def check_args(s0s, w, k, delta, eg, keep) -> int:
    """ValueError naming the argument unless s0s is a non-empty sequence of fp32 [B, H, Dk, Dv] (one a layer, all
    of one shape), w [L, B, P, H], k [L, B, P, Hk, Dk] with Hk dividing H, delta [L, B, P, H, Dv], eg [L, B, H]
    and keep [B] bool. Returns rep = H / Hk."""
    s = check_per_layer("gdn_commit", "s0s", s0s, "[B, H, Dk, Dv]", jnp.float32, item=("state", "states"))
    layers, (b, h, dk, dv) = len(s0s), s.shape
    if w.ndim != 4 or w.shape[:2] != (layers, b) or w.shape[3] != h:
        raise ValueError(f"gdn_commit: w {w.shape} must be [L, B, P, H] = [{layers}, {b}, P, {h}]")
    p = w.shape[2]
    if k.ndim != 5 or k.shape[:3] != (layers, b, p) or k.shape[4] != dk or not k.shape[3] or h % k.shape[3]:
        raise ValueError(f"gdn_commit: k {k.shape} must be [L, B, P, Hk, Dk] = [{layers}, {b}, {p}, Hk, {dk}] "
                         f"with Hk dividing H = {h}")
    if delta.shape != (layers, b, p, h, dv):
        raise ValueError(f"gdn_commit: delta {delta.shape} must be [L, B, P, H, Dv] = {(layers, b, p, h, dv)}")
    if eg.shape != (layers, b, h):
        raise ValueError(f"gdn_commit: eg {eg.shape} must be [L, B, H] = {(layers, b, h)}")
    if keep.shape != (b,) or keep.dtype != jnp.bool_:
        raise ValueError(f"gdn_commit: keep {keep.shape} {keep.dtype} must be bool [B] = [{b}]")
    return h // k.shape[3]


def gdn_commit(s0s, w, k, delta, eg, keep):
    """s0s: L states [B, H, Dk, Dv] fp32; w [L, B, P, H]; k [L, B, P, Hk, Dk]; delta [L, B, P, H, Dv]; eg [L, B, H]
    (e^{G_a}); keep [B] bool. Returns the L states S1 (module docstring)."""
    rep = check_args(s0s, w, k, delta, eg, keep)
    k = jnp.repeat(k.astype(jnp.float32), rep, 3)
    upd = jnp.einsum("lbnh,lbnhk,lbnhv->lbhkv", w, k, delta, precision=_HI)
    on = keep[:, None, None, None]
    return tuple(jnp.where(on, e[..., None, None] * s0 + u, s0) for s0, e, u in zip(s0s, eg, upd))
