"""Pure-jnp reference of one Gated DeltaNet decode step (one new token per sequence): the spec of the
fused kernel, and the same math as jaxspec/model.py's GatedDeltaNet on a one-node chain.

From the token's in_proj outputs to the gated, normalised output that goes into out_proj, per value
head h (key head h // rep):

    x      = silu(sum_j window_j * w_j)                 depthwise causal conv over the last K inputs
    q, k   = l2norm(x_q) / sqrt(Dk), l2norm(x_k);  v = x_v
    g      = -exp(A_log) softplus(a + dt_bias);   beta = sigmoid(b)
    Delta  = beta (v - e^g S0^T k)                      (the one-node tree delta rule)
    o      = e^g S0^T q + (q . k) Delta
    out    = RMSNorm(o) * w_norm * silu(z)

and what commit needs: k (per key head), Delta, G = g. The state after the token, e^g S0 + k Delta^T,
is left to commit, as for every tree.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def _l2norm(x, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + eps)


def heads(conv_in, z, s0):
    """(Hk, rep, Dk, Dv) from conv_in [B, C], z [B, Hv, Dv], s0 [B, Hv, Dk, Dv]."""
    if conv_in.ndim != 2 or z.ndim != 3 or s0.ndim != 4:
        raise ValueError(f"gdn_decode: conv_in {conv_in.shape}, z {z.shape} and s0 {s0.shape} must be [B, C], "
                         f"[B, Hv, Dv] and [B, Hv, Dk, Dv]")
    hv, dv = z.shape[1:]
    dk = s0.shape[2]
    if not (hv and dv and dk):
        raise ValueError(f"gdn_decode: z {z.shape} and s0 {s0.shape} need value heads, Dv and Dk > 0")
    hk = (conv_in.shape[-1] - hv * dv) // (2 * dk)
    if hk < 1 or hv % hk or hk * (2 * dk) + hv * dv != conv_in.shape[-1]:
        raise ValueError(f"gdn_decode: {conv_in.shape[-1]} conv channels do not hold {hv} value heads of {dv} "
                         f"and whole key heads of {dk}")
    return hk, hv // hk, dk, dv


def check_args(conv_in, history, conv_w, z, a, b, A_log, dt_bias, norm_w, s0):
    """`heads`, after checking every argument against conv_in [B, C], z [B, Hv, Dv] and s0's Dk (the shapes of
    `gdn_decode`). Static shapes, so a Python check (also under jit); a mismatch is refused naming the argument.
    The kernel reads wrong shapes out of bounds (NaN or garbage); the jnp reference broadcasts some."""
    hk, rep, dk, dv = heads(conv_in, z, s0)
    (bsz, c), hv = conv_in.shape, hk * rep
    if conv_w.ndim != 2 or conv_w.shape[0] < 1 or conv_w.shape[1] != c:
        raise ValueError(f"gdn_decode: conv_w {conv_w.shape} must be [K, C] = (K, {c}), K >= 1, for conv_in "
                         f"{conv_in.shape}")
    kw = conv_w.shape[0]
    want = dict(history=("[B, K-1, C]", history, (bsz, kw - 1, c)), z=("[B, Hv, Dv]", z, (bsz, hv, dv)),
                a=("[B, Hv]", a, (bsz, hv)), b=("[B, Hv]", b, (bsz, hv)), A_log=("[Hv]", A_log, (hv,)),
                dt_bias=("[Hv]", dt_bias, (hv,)), norm_w=("[Dv]", norm_w, (dv,)),
                s0=("[B, Hv, Dk, Dv]", s0, (bsz, hv, dk, dv)))
    for name, (dims, x, shape) in want.items():
        if x.shape != shape:
            raise ValueError(f"gdn_decode: {name} {x.shape} must be {dims} = {shape} for conv_in {conv_in.shape}, "
                             f"conv_w {conv_w.shape} and z {z.shape}")
    return hk, rep, dk, dv


def gdn_decode(conv_in, history, conv_w, z, a, b, A_log, dt_bias, norm_w, s0, *, eps: float):
    """conv_in [B, C] (this token's in_proj_qkv output; channels per key head: q, k, then its rep value
    heads' v); history [B, K-1, C] (the previous K-1 conv inputs, oldest first); conv_w [K, C] (tap K-1
    multiplies this token); z [B, Hv, Dv]; a, b [B, Hv] (in_proj_a / in_proj_b outputs); A_log, dt_bias
    [Hv]; norm_w [Dv]; s0 [B, Hv, Dk, Dv] fp32.
    Returns out [B, Hv, Dv] in conv_in's dtype, k [B, Hk, Dk], delta [B, Hv, Dv], G [B, Hv] (fp32)."""
    f32 = jnp.float32
    hk, rep, dk, dv = check_args(conv_in, history, conv_w, z, a, b, A_log, dt_bias, norm_w, s0)
    bsz = conv_in.shape[0]
    window = jnp.concatenate([history.astype(f32), conv_in[:, None].astype(f32)], 1)        # [B, K, C]
    x = jax.nn.silu(jnp.einsum("bjc,jc->bc", window, conv_w.astype(f32), precision=_HI))
    x = x.reshape(bsz, hk, 2 * dk + rep * dv)
    q = _l2norm(x[..., :dk]) * dk ** -0.5
    k = _l2norm(x[..., dk:2 * dk])
    v = x[..., 2 * dk:].reshape(bsz, hk * rep, dv)
    qv, kv = jnp.repeat(q, rep, 1), jnp.repeat(k, rep, 1)                                  # [B, Hv, Dk]
    g = -jnp.exp(A_log.astype(f32)) * jax.nn.softplus(a.astype(f32) + dt_bias.astype(f32))
    beta = jax.nn.sigmoid(b.astype(f32))
    s0 = s0.astype(f32)
    eg = jnp.exp(g)[..., None]
    delta = beta[..., None] * (v - eg * jnp.einsum("bhk,bhkv->bhv", kv, s0, precision=_HI))
    o = eg * jnp.einsum("bhk,bhkv->bhv", qv, s0, precision=_HI) + jnp.sum(qv * kv, -1, keepdims=True) * delta
    dt = conv_in.dtype
    ob = o.astype(dt).astype(f32)                                # the model normalises o in its own dtype
    n = (ob * jax.lax.rsqrt(jnp.mean(ob * ob, -1, keepdims=True) + eps) * norm_w.astype(f32)).astype(dt)
    out = (n.astype(f32) * jax.nn.silu(z.astype(f32))).astype(dt)
    return out, k, delta, g
