"""Pure-jnp reference of the GDN layer's inputs to the tree delta rule: the spec of the fused kernel, and
what jaxspec/model.py's GatedDeltaNet runs off the GPU.

From the in_proj product y [B, N, W] of a block of N tree nodes (W = Hk groups, each [conv channels of the
group (q, k, then its rep value heads' v), z, b, a], the layout of model.fuse_kernels), per value head h (key
head h // rep):

    x      = silu(sum_d conv_w[K-1-d] * window_d)    depthwise causal conv along ancestors: window_d is the
                                                       conv input d steps up the node's path (distances past the
                                                       root read the committed history of the last K-1 inputs)
    q, k   = l2norm(x_q) / sqrt(Dk), l2norm(x_k);  v = x_v
    g      = -exp(A_log) softplus(a + dt_bias);   beta = sigmoid(b)

in fp32, as pallas_kernels/gdn_decode does for one token (the conv accumulates in fp32, like the
causal-conv1d kernel; before session 42 the model summed its taps in the weights' dtype).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_HI = jax.lax.Precision.HIGHEST


def groups(op: str, w: int, c: int, hv: int, dk: int, dv: int):
    """(Hk, rep, conv channels a group, in_proj width a group) of an in_proj product of width w with c conv
    channels and hv value heads (W = Hk (2 Dk + rep Dv) conv channels + Hv Dv of z + 2 Hv of gates); a shape that
    does not hold whole key heads is refused, naming `op`."""
    hk = (c - hv * dv) // (2 * dk) if dk > 0 else 0
    if hk < 1 or hv % hk or hk * 2 * dk + hv * dv != c or w != c + hv * dv + 2 * hv:
        raise ValueError(f"{op}: in_proj width {w} and {c} conv channels do not hold {hv} value heads of {dv} and "
                         f"whole key heads of {dk}")
    return hk, hv // hk, c // hk, w // hk


def layout(y, history, conv_w, A_log, dt_bias, rows, dk: int, dv: int):
    """`groups` from y [B, N, W], conv_w [K, C], A_log [Hv], after checking the other arguments against them:
    history [B, K-1, C], dt_bias [Hv], rows [B, K, N] integer. Static shapes, so a Python check (also under jit); a
    mismatch is refused naming the argument. The kernel reads wrong shapes out of bounds (NaN or garbage)."""
    if y.ndim != 3 or conv_w.ndim != 2 or conv_w.shape[0] < 1 or A_log.ndim != 1:
        raise ValueError(f"gdn_tree_inputs: y {y.shape}, conv_w {conv_w.shape} and A_log {A_log.shape} must be "
                         f"[B, N, W], [K, C] (K >= 1) and [Hv]")
    hk, rep, gc, gw = groups("gdn_tree_inputs", y.shape[-1], conv_w.shape[1], A_log.shape[0], dk, dv)
    (b, n, _), (kw, c), hv = y.shape, conv_w.shape, A_log.shape[0]
    want = dict(history=("[B, K-1, C]", history, (b, kw - 1, c)), dt_bias=("[Hv]", dt_bias, (hv,)),
                rows=("[B, K, N]", rows, (b, kw, n)))
    for name, (dims, x, shape) in want.items():
        if x.shape != shape:
            raise ValueError(f"gdn_tree_inputs: {name} {x.shape} must be {dims} = {shape} for y {y.shape}, "
                             f"conv_w {conv_w.shape} and A_log {A_log.shape}")
    if not jnp.issubdtype(rows.dtype, jnp.integer):
        raise ValueError(f"gdn_tree_inputs: rows {rows.shape} {rows.dtype} must be [B, K, N] integer (indices into "
                         f"concat(history, nodes))")
    return hk, rep, gc, gw


def gdn_tree_inputs(y, history, conv_w, A_log, dt_bias, rows, *, dk: int, dv: int):
    """y [B, N, W] (the in_proj product); history [B, K-1, C] (the last K-1 committed conv inputs, oldest
    first); conv_w [K, C] (tap K-1 multiplies the node itself); A_log, dt_bias [Hv]; rows [B, K, N] int32
    (row d: each node's conv input d steps up, as an index into concat(history, nodes): model.window_index).
    Returns q, k [B, N, Hk, Dk], v [B, N, Hv, Dv], g, beta [B, N, Hv], all fp32."""
    f32 = jnp.float32
    hk, rep, gc, gw = layout(y, history, conv_w, A_log, dt_bias, rows, dk, dv)
    b, n = y.shape[:2]
    hv, kw = hk * rep, conv_w.shape[0]
    grouped = y.reshape(b, n, hk, gw)
    conv_in = grouped[..., :gc].reshape(b, n, hk * gc)
    gates = grouped[..., gc + rep * dv:].astype(f32)                      # [B, N, Hk, 2 rep]: b, then a
    beta_in, a = gates[..., :rep].reshape(b, n, hv), gates[..., rep:].reshape(b, n, hv)
    # Joined in the inputs' own dtype, each gathered window then cast: the same fp32 values as joining in fp32 (a
    # cast to fp32 is exact), at half the bytes of the [B, K-1+N, C] join for bf16 (an 8K prefill's is 168 MB).
    dt = history.dtype if history.dtype == conv_in.dtype else f32
    ext = jnp.concatenate([history.astype(dt), conv_in.astype(dt)], 1)   # [B, K-1+N, C]
    w = conv_w.astype(f32)
    x = sum(jnp.take_along_axis(ext, rows[:, d, :, None], 1).astype(f32) * w[kw - 1 - d] for d in range(kw))
    x = jax.nn.silu(x).reshape(b, n, hk, gc)
    l2 = lambda t: t * jax.lax.rsqrt(jnp.sum(t * t, -1, keepdims=True) + 1e-6)
    q = l2(x[..., :dk]) * dk ** -0.5
    k = l2(x[..., dk:2 * dk])
    v = x[..., 2 * dk:].reshape(b, n, hv, dv)
    g = -jnp.exp(A_log.astype(f32)) * jax.nn.softplus(a + dt_bias.astype(f32))
    return q, k, v, g, jax.nn.sigmoid(beta_in)
