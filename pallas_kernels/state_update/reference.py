"""Pure-jnp reference of the commit's GDN state update for one layer: the spec of the kernel, and what
jaxspec/model.py's commit runs off the GPU and by default (there as `states_at`, all layers in one product).

After the last accepted node a (its ancestors-or-self anc_row [B, N]; `last` [B] its index), the state is

    S1 = e^{G_a} S0 + sum_j anc_row_j e^{G_a - G_j} k_j Delta_j^T          (G_a = G[last], per value head)

with S0 the state entering the block [B, H, Dk, Dv] fp32, k [B, N, Hk, Dk] (key head h // (H / Hk) serves
value head h), Delta [B, N, H, Dv] and G [B, N, H] fp32 from the verify (jaxspec.model.GDNPending). Rows with
keep False (nothing accepted) keep S0.
"""

from __future__ import annotations

import jax.numpy as jnp

from pallas_kernels.tree_delta_rule.reference import state_at


def check(s0, k, delta, G, anc_row, last, keep):
    """Refuse shapes that do not fit together, naming them."""
    b, h, dk, dv = s0.shape
    n = G.shape[1]
    want = {"k": (b, n, None, dk), "delta": (b, n, h, dv), "G": (b, n, h), "anc_row": (b, n), "last": (b,),
            "keep": (b,)}
    for name, x in zip(want, (k, delta, G, anc_row, last, keep)):
        shape = want[name]
        if len(x.shape) != len(shape) or any(w is not None and w != s for w, s in zip(shape, x.shape)):
            raise ValueError(f"state_update: {name} {tuple(x.shape)} does not fit s0 {tuple(s0.shape)} and "
                             f"G {tuple(G.shape)}")
    if h % k.shape[2]:
        raise ValueError(f"state_update: {h} value heads do not group over {k.shape[2]} key heads")


def state_update(s0, k, delta, G, anc_row, last, keep):
    """S1 [B, H, Dk, Dv] fp32 (see the module docstring)."""
    check(s0, k, delta, G, anc_row, last, keep)
    f32 = jnp.float32
    G = G.astype(f32)
    G_a = jnp.take_along_axis(G, last[:, None, None].astype(jnp.int32), 1)[:, 0]          # [B, H]
    s1 = state_at(s0.astype(f32), k.astype(f32), delta.astype(f32), G, anc_row.astype(bool), G_a)
    return jnp.where(keep[:, None, None, None], s1, s0.astype(f32))
