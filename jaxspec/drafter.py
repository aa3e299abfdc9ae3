"""The DFlash block-diffusion drafter in Flax NNX (DESIGN.md section 1, reference/dflash.md section 1).

Target hidden states (the taps) enter every layer only as extra keys/values, and a layer's context K/V
depend on the fused taps alone, not on the layer's input. So the context K/V of all layers are computed
once per new context row (`add_context`) and cached; a draft (`draft`) runs only the block
[anchor, MASK x (block_size - 1)] as queries over cached context + the block itself. A full-attention
layer writes the block's K/V into its cache rows just past the context (scratch: masked until the next
`add_context` overwrites them) and attends with the target's tree attention (the Pallas kernel on GPU,
which reads only the rows up to the block's end, not the whole cache); sliding-window layers attend over
their ring in jnp. The drafter has no embedding or lm_head: `draft` takes the target's.

Parameter names mirror the checkpoint keys (`fc.weight` -> `fc.kernel`, `layers.{i}.self_attn.q_proj...`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec import sharding
from jaxspec.drafter_config import DrafterConfig
from jaxspec.model import Linear, RMSNorm, cached_tree_attention, mask_vocab, rope


def _norm(cfg: DrafterConfig, dim: int):
    # Qwen3 drafter norms are plain `w * x_hat`, unlike the target's (1 + w).
    return RMSNorm(dim, eps=cfg.rms_norm_eps, offset=0.0, dtype=cfg.jnp_dtype)


class DrafterMLP(nnx.Module):
    def __init__(self, cfg: DrafterConfig, *, rngs: nnx.Rngs):
        dt, d, f = cfg.jnp_dtype, cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = Linear(d, f, dtype=dt, rngs=rngs)
        self.up_proj = Linear(d, f, dtype=dt, rngs=rngs)
        self.down_proj = Linear(f, d, dtype=dt, rngs=rngs)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DrafterAttention(nnx.Module):
    """GQA with per-head q_norm/k_norm before RoPE over the full head_dim; no output gate."""

    def __init__(self, cfg: DrafterConfig, *, rngs: nnx.Rngs):
        dt, d, hd = cfg.jnp_dtype, cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.q_proj = Linear(d, cfg.num_heads * hd, dtype=dt, rngs=rngs)
        self.k_proj = Linear(d, cfg.num_kv_heads * hd, dtype=dt, rngs=rngs)
        self.v_proj = Linear(d, cfg.num_kv_heads * hd, dtype=dt, rngs=rngs)
        self.o_proj = Linear(cfg.num_heads * hd, d, dtype=dt, rngs=rngs)
        self.q_norm = _norm(cfg, hd)
        self.k_norm = _norm(cfg, hd)

    def kv(self, x, positions):
        """Keys (k_norm, then RoPE at `positions` [B,N]) and values of x [B,N,D]: [B,N,KV,hd] each."""
        cfg = self.cfg
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).reshape(b, n, cfg.num_kv_heads, cfg.head_dim))
        k = rope(k, positions, cfg.head_dim, cfg.rope_theta)
        return k, self.v_proj(x).reshape(b, n, cfg.num_kv_heads, cfg.head_dim)

    def queries(self, x, positions):
        """Queries (q_norm, then RoPE at `positions` [B,N]) of x [B,N,D]: [B,N,H,hd]."""
        cfg = self.cfg
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(b, n, cfg.num_heads, cfg.head_dim))
        return rope(q, positions, cfg.head_dim, cfg.rope_theta)

    def __call__(self, x, positions, keys, values, visible):
        """x [B,N,D] block at `positions` [B,N]; keys/values [B,L,KV,hd] the cached context; visible
        [B,N,L+N] over (context rows, block rows)."""
        cfg = self.cfg
        b, n, _ = x.shape
        hd, kvh = cfg.head_dim, cfg.num_kv_heads
        q = self.queries(x, positions)
        kb, vb = self.kv(x, positions)
        k = jnp.concatenate([keys.astype(kb.dtype), kb], 1)
        v = jnp.concatenate([values.astype(vb.dtype), vb], 1)
        qh = q.reshape(b, n, kvh, cfg.num_heads // kvh, hd)   # q head h reads kv head h // group
        scores = jnp.einsum("bnkgh,blkh->bkgnl", qh, k).astype(jnp.float32) / math.sqrt(hd)
        scores = jnp.where(visible[:, None, None], scores, -jnp.inf)
        probs = jax.nn.softmax(scores, -1).astype(v.dtype)
        out = jnp.einsum("bkgnl,blkh->bnkgh", probs, v).reshape(b, n, cfg.num_heads * hd)
        return self.o_proj(out.astype(x.dtype))

    def over_cache(self, x, start, keys, values, anc):
        """The block x [B,N,D] at positions start .. start+N-1 ([B] start) over a full (not ring) cache
        keys/values [B,L,KV,hd] with L >= start + N: the block's K/V go into rows start .. start+N-1, and
        slot i sees the context rows < start and block slot j iff anc[b, i, j] ([B,N,N]).
        Returns (out [B,N,D], keys, values), the cache with those rows written."""
        b, n, _ = x.shape
        positions = start[:, None] + jnp.arange(n, dtype=jnp.int32)[None]
        kb, vb = self.kv(x, positions)
        batch = jnp.arange(b)[:, None]
        keys = keys.at[batch, positions].set(kb.astype(keys.dtype), mode="drop")
        values = values.at[batch, positions].set(vb.astype(values.dtype), mode="drop")
        out = cached_tree_attention(self.queries(x, positions).astype(keys.dtype), keys, values, start, anc)
        return self.o_proj(out.reshape(b, n, -1).astype(x.dtype)), keys, values


class DrafterLayer(nnx.Module):
    def __init__(self, cfg: DrafterConfig, *, rngs: nnx.Rngs):
        self.input_layernorm = _norm(cfg, cfg.hidden_size)
        self.self_attn = DrafterAttention(cfg, rngs=rngs)
        self.post_attention_layernorm = _norm(cfg, cfg.hidden_size)
        self.mlp = DrafterMLP(cfg, rngs=rngs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DrafterCache:
    """Context K/V per layer, batch axis first. Windowed layers keep a ring of min(window, max_len) rows
    (row = position mod rows); the others keep max_len + block_size rows (row = position), the last
    block_size of them room for a draft's block past a context of max_len. Rows at and past `length` are
    scratch (a full layer's last drafted block): masked, and overwritten by `add_context`."""

    length: jax.Array               # [B] int32 context rows added = position of the next anchor
    keys: tuple[jax.Array, ...]     # per layer [B, rows, KV, hd], post k_norm, post RoPE
    values: tuple[jax.Array, ...]

    @property
    def rows(self) -> tuple[int, ...]:
        return tuple(k.shape[1] for k in self.keys)


def _ring_positions(length, rows: int):
    """Absolute position held by each row [B, rows] of a ring (row = position mod rows); negative where the
    row is empty."""
    r = jnp.arange(rows, dtype=jnp.int32)[None]
    last = length[:, None] - 1
    return last - jnp.mod(last - r, rows)


def _visible(q_pos, k_pos, causal: bool, window: int | None):
    """Mask on absolute positions: q_pos [B,N,1], k_pos [B,1,L] -> [B,N,L]."""
    d = q_pos - k_pos
    vis = jnp.ones(d.shape, bool)
    if causal:
        vis &= d >= 0
    if window is not None:
        vis &= d < window
        if not causal:
            vis &= -d < window
    return vis


class Drafter(nnx.Module):
    """fc -> hidden_norm fuses the taps into context; `layers`; final `norm`; target lm_head outside."""

    def __init__(self, cfg: DrafterConfig, *, rngs: nnx.Rngs):
        dt, d = cfg.jnp_dtype, cfg.hidden_size
        self.cfg = cfg
        self.fc = Linear(cfg.n_taps * d, d, dtype=dt, rngs=rngs)
        self.hidden_norm = _norm(cfg, d)
        self.layers = nnx.List([DrafterLayer(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.norm = _norm(cfg, d)

    def init_cache(self, batch: int, max_len: int) -> DrafterCache:
        return init_cache(self.cfg, batch, max_len)

    def add_context(self, cache: DrafterCache, taps, n_new) -> DrafterCache:
        """Append context rows at positions length .. length + n_new - 1.

        taps [B,T,n_taps,D] (as the target returns them) or [B,T,n_taps*D], in target_layer_ids order;
        only the first n_new[b] rows of sequence b are used (the rest is padding). n_new [B] or a scalar,
        0 <= n_new <= T. Full-window layers need length + n_new <= max_len; rows past it are dropped.
        """
        cfg = self.cfg
        b, t = taps.shape[:2]
        if taps.shape[2:] not in ((cfg.n_taps, cfg.hidden_size), (cfg.n_taps * cfg.hidden_size,)):
            raise ValueError(f"taps {taps.shape}: expected [B, T, {cfg.n_taps}, {cfg.hidden_size}] or "
                             f"[B, T, {cfg.n_taps * cfg.hidden_size}]")
        n_new = jnp.broadcast_to(jnp.asarray(n_new, jnp.int32), (b,))
        c = self.hidden_norm(self.fc(taps.reshape(b, t, -1).astype(cfg.jnp_dtype)))
        idx = jnp.arange(t, dtype=jnp.int32)[None]
        pos = cache.length[:, None] + idx
        valid = idx < n_new[:, None]
        batch = jnp.arange(b)[:, None]
        keys, values = [], []
        for layer, kc, vc, window in zip(self.layers, cache.keys, cache.values, cfg.windows):
            rows = kc.shape[1]
            k, v = layer.self_attn.kv(c, pos)
            if window is None:
                slot = jnp.where(valid, pos, rows)
            else:
                # A chunk longer than the ring writes only its last `rows` rows: scattering two rows to
                # one slot has no defined winner.
                keep = valid & (idx >= n_new[:, None] - rows)
                slot = jnp.where(keep, jnp.mod(pos, rows), rows)
            keys.append(kc.at[batch, slot].set(k.astype(kc.dtype), mode="drop"))
            values.append(vc.at[batch, slot].set(v.astype(vc.dtype), mode="drop"))
        return DrafterCache(cache.length + n_new, tuple(keys), tuple(values))

    def draft(self, cache: DrafterCache, anchor, embed, lm_head_kernel, block_size: int | None = None):
        """(logits [B, block_size - 1, V] (fp32), cache) for the block [anchor, MASK x (block_size - 1)] at
        positions length .. length + block_size - 1 (block slot j predicts the token at length + j).

        anchor [B] int: the last committed token (not yet in the context). embed [V, D]: the target's raw
        embedding table; lm_head_kernel [D, V]: the target's lm_head (embed.T when tied). `block_size` is
        static; None means cfg.block_size. The returned cache has the same context (and `length`); only
        its scratch rows past the context changed (the full layers' block K/V).
        """
        cfg = self.cfg
        bs = cfg.block_size if block_size is None else int(block_size)
        if not 2 <= bs <= cfg.block_size:       # the cache keeps scratch rows for cfg.block_size; more are dropped
            raise ValueError(f"draft: block_size {bs} must be in [2, {cfg.block_size}] (the drafter's block_size)")
        b = anchor.shape[0]
        tokens = jnp.concatenate([anchor.astype(jnp.int32)[:, None],
                                  jnp.full((b, bs - 1), cfg.mask_token_id, jnp.int32)], 1)
        x = sharding.vocab_rows(embed, tokens).astype(cfg.jnp_dtype)
        start = cache.length
        q_pos = start[:, None] + jnp.arange(bs, dtype=jnp.int32)[None]
        keys, values = [], []
        for layer, kc, vc, causal, window in zip(self.layers, cache.keys, cache.values, cfg.causal, cfg.windows):
            h = layer.input_layernorm(x)
            if window is None:
                anc = jnp.broadcast_to(_visible(q_pos[:, :, None], q_pos[:, None, :], causal, None), (b, bs, bs))
                out, kc, vc = layer.self_attn.over_cache(h, start, kc, vc, anc)
            else:
                k_pos = _ring_positions(start, kc.shape[1])
                filled = (k_pos >= 0) & (k_pos < start[:, None])
                vis = jnp.concatenate([
                    filled[:, None, :] & _visible(q_pos[:, :, None], k_pos[:, None, :], causal, window),
                    _visible(q_pos[:, :, None], q_pos[:, None, :], causal, window)], 2)
                out = layer.self_attn(h, q_pos, kc, vc, vis)
            keys.append(kc)
            values.append(vc)
            x = x + out
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        h = self.norm(x[:, 1:])
        logits = mask_vocab(jnp.einsum("bnd,dv->bnv", h, lm_head_kernel.astype(h.dtype)).astype(jnp.float32),
                            cfg.vocab_size)
        return logits, DrafterCache(cache.length, tuple(keys), tuple(values))


def init_cache(cfg: DrafterConfig, batch: int, max_len: int) -> DrafterCache:
    """Empty cache for `batch` sequences of up to `max_len` context rows each (full layers: + block_size
    rows of room for a draft's block)."""
    dt = cfg.jnp_dtype
    shape = lambda rows: (batch, rows, cfg.num_kv_heads, cfg.head_dim)
    rows = [max_len + cfg.block_size if w is None else min(w, max_len) for w in cfg.windows]
    return DrafterCache(
        length=jnp.zeros((batch,), jnp.int32),
        keys=tuple(jnp.zeros(shape(r), dt) for r in rows),
        values=tuple(jnp.zeros(shape(r), dt) for r in rows),
    )
