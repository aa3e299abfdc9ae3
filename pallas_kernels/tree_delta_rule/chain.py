"""The delta rule over a long chain (a prefill): blocks in parallel, then one pass of the state.

A chain of T tokens runs in blocks of C. Nothing a block computes depends on the state entering it except
through two products (reference.block_factors):

    Delta = Tb V - W S        O = E Q S + P Delta        S_next = e^{G_last} S + Kd^T Delta

with W = Tb E K, P = D * Q K^T and Kd = e^{G_last - G} K. So Tb, P and the products above that do not involve S
or Delta are formed for all blocks at once (batched products), and only the pass over the blocks is serial
(reference.state_pass, or `pallas_triton.state_pass`: one kernel for the whole pass, whose loop keeps Delta and the
state update and writes Delta and the state entering each block; O is then two batched products). Before, the model ran the
whole tree delta rule once per block in a scan: on an H100 at the real shape the 8K prefill's GDN part took 492 ms,
74,265 kernels, most of them a few microseconds each (bench/results/2026-12-06-h100-s61/prefill-gdn/).

A token with g = beta = 0 leaves the state exactly as it was (its Delta is 0 and its decay 1), so a caller
commits only a prefix of a row by zeroing both past it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.tree_delta_rule import api, pallas_triton, reference, xla

CHUNK = 64


def chain_delta_rule(q, k, v, g, beta, s0, *, chunk: int = CHUNK, implementation: str | None = None):
    """The gated delta rule over one chain per batch row, in blocks of `chunk` with the state carried.

    q, k [B, T, Hk, Dk] (q scaled, both l2-normalised), v [B, T, H, Dv], g, beta [B, T, H], s0 [B, H, Dk, Dv].
    Returns o [B, T, H, Dv] and the state after the last token [B, H, Dk, Dv], fp32. The implementation is the
    tree delta rule's for a block of `chunk` nodes (api.resolve): its kernels run the blocks' factors and the
    state pass; the jnp solvers run them as products and a scan."""
    b, n, h, dv = v.shape
    reference.check_args(q, k, v, g, beta, jax.ShapeDtypeStruct((b, n, n), jnp.bool_), s0)
    rep = h // q.shape[2]
    name = api.resolve(chunk, implementation)
    kernels = name.startswith("pallas")
    interpret = name == "pallas_interpret"
    f32 = jnp.float32
    nb = max(1, -(-n // chunk))
    # Padded tokens have g = beta = 0: they leave the state as it is.
    pad = lambda x: jnp.pad(x.astype(f32), [(0, 0), (0, nb * chunk - n)] + [(0, 0)] * (x.ndim - 2))
    q, k, v, g, beta = (pad(x).reshape((b * nb, chunk) + x.shape[2:]) for x in (q, k, v, g, beta))
    if kernels:
        tb, p, G = pallas_triton.block_factors(q, k, g, beta, interpret=interpret)
        prec = jax.lax.Precision.HIGHEST if interpret else pallas_triton.PRECISIONS["tf32x3"]
    else:
        tb, p, G = reference.block_factors(q, k, g, beta,
                                           inverse=xla.unit_lower_inverse if name == "xla" else None)
        prec = jax.lax.Precision.HIGHEST
    product = lambda a, x: jnp.einsum("xhij,xjhd->xhid", a, x, precision=prec)
    q, k = (jnp.repeat(x, rep, 2) for x in (q, k))                                  # [B NB, C, H, Dk]
    eG = jnp.exp(G)[..., None]
    ek = eG * k
    last = G[:, -1]                                                                   # [B NB, H]
    w = product(tb, ek)
    kdt = jnp.moveaxis(jnp.exp(last[:, None] - G)[..., None] * k, 1, 3)               # [B NB, H, Dk, C]
    by_block = lambda x: x.reshape((b, nb) + x.shape[1:])
    factors = tuple(by_block(x) for x in (w, jnp.swapaxes(eG * q, 1, 2), kdt, product(tb, v), p, jnp.exp(last)))
    if kernels:
        o, s = pallas_triton.state_pass(*factors, s0, interpret=interpret)
    else:
        o, s = reference.state_pass(*factors, s0)
    o = jnp.swapaxes(o, 2, 3).reshape(b, nb * chunk, h, dv)[:, :n]
    return o, s
