# A row-invariant ("exact") forward of the target, as a patch, to test whether bf16 speculation can be made
# token-identical to bf16 AR on this CPU. Each piece is fenced by jax.lax.optimization_barrier so that XLA cannot fuse
# an elementwise producer or consumer into a product (session 33's rowlocal.py: the fused pieces are what give a row
# other bits at 8 rows than alone; a bare product does not), and the GDN chain is solved one node at a time
# (jaxspec.model.CHUNK = 1), each node exactly as AR's one-token step, so a verify's node sees the bits AR's step would.
#   PYTHONPATH=. python bench/results/2026-12-03-cpu-s33-exact-bf16/exact.py eval [jaxspec.train eval flags]
#   PYTHONPATH=. python bench/results/2026-12-03-cpu-s33-exact-bf16/exact.py SCRIPT.py [its arguments]   (patched, then run)
# EXACT_PARTS (default "linear,logits,attention,chunk"; "norm" fences the residual add before its norm;
# "gdn" runs every GDN node through one fenced one-node step, chains only: with "chunk") picks them.
import math
import os
import runpy
import sys

import jax
import jax.numpy as jnp

import jaxspec.model as model
from pallas_kernels.tree_attention.reference import visible

fence = jax.lax.optimization_barrier
parts = set(os.environ.get("EXACT_PARTS", "linear,logits,attention,chunk").split(","))


TILE = int(os.environ.get("EXACT_TILE", "16"))
ATTN_TILE = int(os.environ.get("EXACT_ATTN_TILE", "16"))


def tiled(x, w):
    """x [..., K] @ w [K, N] with the rows padded to whole tiles of TILE: every product XLA sees has TILE rows (the
    bare product was not row-invariant inside the model: 0.016% of in_proj_qkv's elements, gdnprobe.py)."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = math.prod(lead)
    pad = -rows % TILE
    xt = jnp.pad(x.reshape(rows, k), ((0, pad), (0, 0))).reshape(-1, TILE, k)
    y = jax.lax.map(lambda xi: fence(jnp.einsum("mk,kn->mn", fence(xi), w)), xt)
    return y.reshape(rows + pad, -1)[:rows].reshape(*lead, -1)


def linear(self, x):
    return tiled(x, self.kernel[...])


def logits(self, h):
    return model.mask_vocab(tiled(fence(self.norm(h)), self.unembedding()).astype(jnp.float32), self.cfg.vocab_size)


def attention_tile(q, keys, values, vis):
    """One tile of query nodes: q [B, ATTN_TILE, H, hd], vis [B, ATTN_TILE, L]."""
    b, n, h, hd = q.shape
    kvh = keys.shape[2]
    qh = fence(q.reshape(b, n, kvh, h // kvh, hd))
    scores = fence(jnp.einsum("bnkgh,blkh->bkgnl", qh, keys, preferred_element_type=jnp.float32,
                              precision=jax.lax.Precision.HIGHEST))
    scores = jnp.where(vis[:, None, None], scores / math.sqrt(hd), -jnp.inf)
    probs = fence(jax.nn.softmax(scores, -1).astype(values.dtype))
    out = fence(jnp.einsum("bkgnl,blkh->bnkgh", probs, values, preferred_element_type=jnp.float32,
                           precision=jax.lax.Precision.HIGHEST))
    return out.reshape(b, n, h, hd).astype(values.dtype)


def attention(q, keys, values, start, anc):
    """pallas_kernels/tree_attention's reference, the query nodes padded to whole tiles of ATTN_TILE and attended tile by
    tile, so that the products see ATTN_TILE query rows whatever N is. A padded node sees nothing of the tree (its
    ancestor row is empty) and is dropped."""
    b, n, h, hd = q.shape
    pad = -n % ATTN_TILE
    qp = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    vis = visible(start, jnp.pad(anc, ((0, 0), (0, pad), (0, pad))), keys.shape[1])         # [B, N + pad, L]
    tiles = (qp.reshape(b, -1, ATTN_TILE, h, hd).swapaxes(0, 1), vis.reshape(b, -1, ATTN_TILE, vis.shape[-1]).swapaxes(0, 1))
    out = jax.lax.map(lambda qv: attention_tile(qv[0], keys, values, qv[1]), tiles)       # [T, B, ATTN_TILE, H, hd]
    return out.swapaxes(0, 1).reshape(b, n + pad, h, hd)[:, :n]


def add_norm(x, u, norm):
    """The residual add, its sum rounded to the stream's dtype and fenced before the norm reads it."""
    s = fence(x + u)
    return s, fence(norm(s))


HI = jax.lax.Precision.HIGHEST


def one_node(q, k, v, g, beta, anc, s0):
    """The delta rule for one node (the N = 1 case of pallas_kernels/tree_delta_rule's reference, D = 1), every
    product and sum materialised and fenced, so that XLA cannot contract a multiply-add or fuse across them
    differently in the AR step's program and in a verify's scan."""
    f32 = jnp.float32
    q, k, v, g, beta, s0 = (fence(x.astype(f32)) for x in (q, k, v, g, beta, s0))
    eG = fence(jnp.exp(g))                                                        # [B,1,H]
    ks0 = fence(jnp.einsum("bnhk,bhkv->bnhv", k, s0, precision=HI))
    decayed = fence(eG[..., None] * ks0)
    delta = fence(beta[..., None] * fence(v - decayed))
    qs0 = fence(jnp.einsum("bnhk,bhkv->bnhv", q, s0, precision=HI))
    qk = fence(jnp.sum(fence(q * k), -1))                                         # [B,1,H]
    o = fence(fence(eG[..., None] * qs0) + fence(qk[..., None] * delta))
    return o, delta, g


def exact_states_at(s0s, ks, deltas, Gs, anc_row, G_nodes, rep: int = 1, nodes=None):
    """states_at for a block of one node (what every commit folds with CHUNK = 1): e^{g} S0 + k delta^T, the two
    terms materialised and fenced before the sum."""
    out = []
    for s0, k, delta, G, gn in zip(s0s, ks, deltas, Gs, G_nodes):
        if nodes is not None:
            raise ValueError("exact states_at: chains only")
        # With CHUNK = 1 a chain's commit marks one node (the last accepted) in anc_row: fold that one.
        last = jnp.argmax(anc_row, 1)[:, None]
        take = lambda x: jnp.take_along_axis(x, last.reshape(last.shape + (1,) * (x.ndim - 2)), 1)
        k, delta = take(k), take(delta)
        k = jnp.repeat(k.astype(jnp.float32), rep, 2)
        on = anc_row.any(1)[:, None, None, None]
        upd = fence(jnp.where(on, fence(k[:, 0, :, :, None] * delta[:, 0, :, None, :]), 0.0))
        out.append(fence(fence(jnp.exp(gn)[..., None, None] * s0) + upd))
    return out


def exact_tree_delta_rule(q, k, v, g, beta, anc, s0):
    if q.shape[1] != 1:
        raise ValueError(f"the exact delta rule takes one node at a time (CHUNK = 1, chains only), got {q.shape[1]}")
    return one_node(q, k, v, g, beta, anc, s0)


def gdn_call(self, x, history, s0, tree):
    """GatedDeltaNet.__call__ (jaxspec/model.py) with every elementwise stage fenced: the conv's taps and partial
    sums, the l2 norms, the gates, the output norm and gate."""
    cfg = self.cfg
    b, n, _ = x.shape
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    conv_in = self.in_proj_qkv(x)
    z = self.in_proj_z(x).reshape(b, n, hv, dv)
    beta = fence(jax.nn.sigmoid(fence(self.in_proj_b(x))).astype(jnp.float32))
    a = fence(self.in_proj_a(x).astype(jnp.float32))
    g = fence(-jnp.exp(self.A_log[...].astype(jnp.float32)) * fence(jax.nn.softplus(a + self.dt_bias[...].astype(jnp.float32))))
    rep = hv // hk
    kw = cfg.conv_kernel
    ext = jnp.concatenate([history.astype(conv_in.dtype), conv_in], 1)
    w = self.conv1d[...]
    acc = 0.0
    for d in range(kw):
        idx = model.window_index(tree, d, kw - 1)
        acc = fence(acc + fence(jnp.take_along_axis(ext, idx[..., None], 1) * w[kw - 1 - d]))
    qkv = fence(jax.nn.silu(acc)).reshape(b, n, hk, 2 * dk + rep * dv)
    l2 = lambda t: fence(t * fence(jax.lax.rsqrt(fence(jnp.sum(fence(t * t), -1, keepdims=True)) + 1e-6)))
    q = fence(l2(qkv[..., :dk].astype(jnp.float32)) * dk ** -0.5)
    k = l2(qkv[..., dk:2 * dk].astype(jnp.float32))
    v = qkv[..., 2 * dk:].reshape(b, n, hv, dv).astype(jnp.float32)
    o, delta, G, s_mid = model.delta_rule(jnp.repeat(q, rep, 2), jnp.repeat(k, rep, 2), v, g, beta, tree, s0)
    o = fence(self.norm(fence(o.astype(x.dtype))))
    o = fence((o * fence(jax.nn.silu(z.astype(jnp.float32)))).astype(x.dtype))
    return self.out_proj(o.reshape(b, n, cfg.value_dim)), model.GDNPending(conv_in, k, delta, G, s_mid)


if "gdn" in parts:
    model.GatedDeltaNet.__call__ = gdn_call
    model._tree_delta_rule = exact_tree_delta_rule
    model.states_at = exact_states_at
    model.state_at = lambda s0, k, delta, G, anc_row, G_node: exact_states_at([s0], [k], [delta], [G], anc_row,
                                                                              [G_node])[0]
if "norm" in parts:
    model.add_norm = add_norm
if "linear" in parts:
    model.Linear.__call__ = linear
if "logits" in parts:
    model.Qwen35.logits = logits
if "attention" in parts:
    model.tree_attention = attention
if "chunk" in parts:
    model.CHUNK = 1
print(f"exact parts: {sorted(parts)}", file=sys.stderr)

if sys.argv[1] == "eval":
    from jaxspec import train
    sys.exit(train.main(["eval"] + sys.argv[2:]))
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")
