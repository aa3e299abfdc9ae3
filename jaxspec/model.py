"""Qwen3.5/3.6 hybrid target in Flax NNX: gated full attention + Gated DeltaNet (DESIGN.md section 1).

The model knows nothing about decoding strategy: it runs one `forward` over a tree of N tokens on top
of a committed `State`, and `commit` folds an accepted path of that tree into the state.
Parameter names follow the Hugging Face checkpoint (`convert/keys.py`), except that the projections one
input feeds are stored side by side as one kernel (`FUSED`: MLP gate|up, attention q|k|v, GDN qkv|z|b|a),
so that a decode step streams each layer's input weights in one product; `fuse_params` / `split_params`
map between the two layouts.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.config import FULL, TargetConfig
from jaxspec.tree import Tree, ancestor_at
from pallas_kernels.chain_attention import api as chain_api
from pallas_kernels.chain_attention import chain_attention
from pallas_kernels.tree_attention import api as attention_api
from pallas_kernels.tree_attention import tree_attention
from jaxspec import sharding
from pallas_kernels.add_rms_norm import add, add_rms_norm
from pallas_kernels.add_rms_norm import api as add_norm_api
from pallas_kernels.conv_commit import api as conv_commit_api
from pallas_kernels.conv_commit import conv_commit
from pallas_kernels.gdn_commit import api as gdn_commit_api
from pallas_kernels.gdn_commit import gdn_commit
from pallas_kernels.gdn_decode import api as gdn_decode_api
from pallas_kernels.gdn_decode import gdn_decode
from pallas_kernels.gdn_tree_inputs import api as gdn_tree_inputs_api
from pallas_kernels.gdn_tree_inputs import gdn_tree_inputs
from pallas_kernels import skinny_matmul
from pallas_kernels.tree_delta_rule import chain_delta_rule, path_terms, resolve, state_at, tree_delta_rule

CHUNK = 64  # delta-rule block length for chains (prefill); trees run as one block


def _init(rngs, shape, dtype, std=0.02):
    return nnx.Param(jax.random.normal(rngs.params(), shape, jnp.float32).astype(dtype) * std)


def k_slices(x, w, slices: int):
    """x [..., K] @ w [K, out] as gcd(slices, K) slices of K, fp32 [S, ..., out] (their sum is the product): one
    batched einsum, the form XLA's split-K gives a skinny product."""
    s = math.gcd(slices, w.shape[0])
    return jnp.einsum("...sk,skd->s...d", x.reshape(*x.shape[:-1], s, -1), w.reshape(s, -1, w.shape[1]),
                      preferred_element_type=jnp.float32)


class Linear(nnx.Module):
    """y = x @ kernel, kernel [in, out] (the transpose of the PyTorch weight). No bias anywhere."""

    def __init__(self, d_in: int, d_out: int, *, dtype, rngs: nnx.Rngs):
        self.kernel = _init(rngs, (d_in, d_out), dtype)

    def __call__(self, x, row_scale=None, slices=0):
        """`row_scale` [..., 1] fp32: each row of the product times it (RMSNorm.deferred's 1 / rms). `slices` > 0:
        the product as that many K slices, fp32 [S, ..., out] with S = gcd(slices, in), for add_norm to sum (what
        XLA makes of a skinny product, handed to the add_rms_norm kernel instead of summed ahead of it)."""
        if slices:
            if row_scale is not None:
                raise ValueError("Linear: row_scale and slices together: the row scale of the norm in front would "
                                 "be lost (slices are for the products in front of add_norm, which take none)")
            return k_slices(x, self.kernel[...], slices)
        y = skinny_matmul.matmul(x, self.kernel[...])     # XLA's dot unless JAXSPEC_SKINNY_MATMUL opts in
        return y if row_scale is None else (y.astype(jnp.float32) * row_scale).astype(y.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm in fp32. `offset=1.0` is Qwen3.5's zero-centred (1 + w) form; 0.0 the plain w form."""

    def __init__(self, dim: int, *, eps: float, offset: float, dtype):
        self.weight = nnx.Param(jnp.full((dim,), 1.0 - offset, dtype))
        self.eps, self.offset = eps, offset

    def __call__(self, x):
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + self.eps)
        return (xf * (self.offset + self.weight[...].astype(jnp.float32))).astype(x.dtype)

    def deferred(self, x):
        """The norm with its row scale left for the product it feeds: (x * (offset + w), 1 / rms(x) [..., 1] fp32),
        so that norm(x) @ W = (x * (offset + w)) @ W * r up to rounding. Taken after the product, the scale no
        longer needs its own pass over x: the sum of squares and x * (offset + w) come out of one fusion, and r rides
        in the product's consumers. #6: 129 fewer kernels in the 27B AR step (bench/results/2026-12-04-h200-s38)."""
        xf = x.astype(jnp.float32)
        r = jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + self.eps)
        return (xf * (self.offset + self.weight[...].astype(jnp.float32))).astype(x.dtype), r


def rope(x, positions, rotary_dim: int, theta: float):
    """rotate_half RoPE on the first `rotary_dim` dims of the last axis; x [B,N,H,D], positions [B,N]."""
    inv = 1.0 / theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim)
    freqs = positions.astype(jnp.float32)[..., None] * inv
    emb = jnp.concatenate([freqs, freqs], -1)[:, :, None, :]
    cos, sin = jnp.cos(emb).astype(x.dtype), jnp.sin(emb).astype(x.dtype)
    xr, xp = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rot = jnp.concatenate([-xr[..., half:], xr[..., :half]], -1)
    return jnp.concatenate([xr * cos + rot * sin, xp], -1)


# ------------------------------------------------------------------------------------------------ fused layout
# Fused kernel -> the checkpoint's kernels it holds. Columns are grouped (`_groups`): group j holds, part after
# part, group j's columns of each part. Groups are what tensor parallelism splits (MLP channels, kv heads with
# their query heads, GDN key heads with their value heads), so a contiguous shard of the fused kernel is the
# fused kernel of the parts' shards. On the H200 the 27B AR step at 1K went 14.29 -> 13.67 ms with it, the MLP's
# product streaming 4.50 TB/s against 4.19 for gate and up apart (bench/results/2026-12-04-h200-s37/fused).
FUSED = {
    "gate_up_proj": ("gate_proj", "up_proj"),
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "in_proj": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
}
PART_OF = {part: fused for fused, parts in FUSED.items() for part in parts}


def _groups(cfg: TargetConfig, fused: str) -> int:
    return {"gate_up_proj": cfg.intermediate_size, "qkv_proj": cfg.num_kv_heads,
            "in_proj": cfg.linear_num_key_heads}[fused]


def part_widths(cfg: TargetConfig, fused: str) -> tuple[int, ...]:
    """Output widths of the parts of a fused kernel, in `FUSED` order."""
    hv = cfg.linear_num_value_heads
    return {"gate_up_proj": (cfg.intermediate_size,) * 2,
            "qkv_proj": (cfg.num_heads * cfg.head_dim * 2,) + (cfg.num_kv_heads * cfg.head_dim,) * 2,
            "in_proj": (cfg.conv_dim, cfg.value_dim, hv, hv)}[fused]


def fuse_kernels(cfg: TargetConfig, fused: str, parts):
    """The fused kernel [in, sum of widths] of the parts' kernels [in, width_i] (numpy or jax arrays)."""
    g = _groups(cfg, fused)
    xp = jnp if any(isinstance(p, jax.Array) for p in parts) else np
    d = parts[0].shape[0]
    return xp.concatenate([p.reshape(d, g, -1) for p in parts], 2).reshape(d, -1)


def split_columns(cfg: TargetConfig, fused: str, y):
    """A fused kernel [in, sum of widths], or its product's output [..., sum of widths], as the parts' [..., width_i]:
    the inverse of `fuse_kernels`."""
    g = _groups(cfg, fused)
    grouped, out, at = y.reshape(*y.shape[:-1], g, -1), [], 0
    for w in part_widths(cfg, fused):
        out.append(grouped[..., at:at + w // g].reshape(*y.shape[:-1], w))
        at += w // g
    return out


def _fused_path(path: tuple):
    """(fused kernel's path, part index) for a checkpoint kernel's path, else None."""
    if len(path) >= 2 and str(path[-1]) == "kernel" and str(path[-2]) in PART_OF:
        fused = PART_OF[str(path[-2])]
        return path[:-2] + (fused, "kernel"), FUSED[fused].index(str(path[-2]))
    return None


def fuse_params(cfg: TargetConfig, values: dict, sharding=None) -> dict:
    """{param path: array} in the checkpoint's layout -> the model's, fusing each group of kernels as soon as
    it is complete; `values` is consumed (its parts are dropped as they are fused, so that a 27B load holds
    one extra layer's kernels at most). sharding: None, or (fused path, shape) -> the Sharding to put the
    fused kernel in (computed there by one jit)."""
    out, pending = {}, {}
    for path in list(values):
        x = values.pop(path)
        target = _fused_path(path)
        if target is None:
            out[path] = x
            continue
        fpath, i = target
        parts = pending.setdefault(fpath, {})
        parts[i] = x
        if len(parts) == len(FUSED[str(fpath[-2])]):
            del pending[fpath]
            name, ordered = str(fpath[-2]), [parts[k] for k in range(len(parts))]
            if sharding is None:
                out[fpath] = fuse_kernels(cfg, name, ordered)
            else:
                shape = (ordered[0].shape[0], sum(p.shape[1] for p in ordered))
                out[fpath] = _fuser(cfg, name, sharding(fpath, shape))(ordered)
    if pending:
        raise KeyError(f"fuse_params: incomplete fused kernels {sorted(map(str, pending))[:3]}")
    return out


@functools.lru_cache(maxsize=None)
def _fuser(cfg: TargetConfig, fused: str, sharding):
    # One compiled program per kernel kind and sharding (jit caches by shape), not one per layer.
    return jax.jit(functools.partial(fuse_kernels, cfg, fused), out_shardings=sharding)


def split_params(cfg: TargetConfig, values: dict) -> dict:
    """{param path: array or ShapeDtypeStruct} in the model's layout -> the checkpoint's (a new dict)."""
    out = {}
    for path, x in values.items():
        name = str(path[-2]) if len(path) >= 2 and str(path[-1]) == "kernel" else ""
        if name not in FUSED:
            out[path] = x
            continue
        fn = functools.partial(split_columns, cfg, name)
        parts = jax.eval_shape(fn, x) if isinstance(x, jax.ShapeDtypeStruct) else fn(x)
        for part, p in zip(FUSED[name], parts):
            out[path[:-2] + (part, "kernel")] = p
    return out


class MLP(nnx.Module):
    def __init__(self, cfg: TargetConfig, *, rngs):
        dt = cfg.jnp_dtype
        self.cfg = cfg
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, dtype=dt, rngs=rngs)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, dtype=dt, rngs=rngs)

    def __call__(self, x, row_scale=None, slices=0):
        """`row_scale`: the deferred scale of the norm in front (RMSNorm.deferred), or None. `slices`: the output
        as the down product's K slices (Linear)."""
        gate, up = split_columns(self.cfg, "gate_up_proj", self.gate_up_proj(x, row_scale))
        return self.down_proj(jax.nn.silu(gate) * up, slices=slices)


class Attention(nnx.Module):
    """Gated full attention: q_proj emits query and a sigmoid output gate, interleaved per head."""

    def __init__(self, cfg: TargetConfig, *, rngs):
        dt, d, hd = cfg.jnp_dtype, cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.qkv_proj = Linear(d, sum(part_widths(cfg, "qkv_proj")), dtype=dt, rngs=rngs)
        self.o_proj = Linear(cfg.num_heads * hd, d, dtype=dt, rngs=rngs)
        self.q_norm = RMSNorm(hd, eps=cfg.rms_norm_eps, offset=1.0, dtype=dt)
        self.k_norm = RMSNorm(hd, eps=cfg.rms_norm_eps, offset=1.0, dtype=dt)

    def __call__(self, x, keys, values, start, positions, tree: Tree, row_scale=None, slices=0):
        """x [B,N,D]; keys/values [B,L,KV,hd] committed cache; start [B]; `row_scale`, `slices` as in MLP. Returns y
        and the cache with the N tree slots written at start..start+N-1."""
        cfg = self.cfg
        b, n, _ = x.shape
        hd, kvh = cfg.head_dim, cfg.num_kv_heads
        qg, k, v = split_columns(cfg, "qkv_proj", self.qkv_proj(x, row_scale))
        qg = qg.reshape(b, n, cfg.num_heads, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:]
        q = rope(self.q_norm(q), positions, cfg.rotary_dim, cfg.rope_theta)
        k = rope(self.k_norm(k.reshape(b, n, kvh, hd)), positions, cfg.rotary_dim, cfg.rope_theta)
        v = v.reshape(b, n, kvh, hd)
        slots = start[:, None] + jnp.arange(n, dtype=jnp.int32)
        rows = jnp.arange(b)[:, None]
        keys = keys.at[rows, slots].set(k.astype(keys.dtype))
        values = values.at[rows, slots].set(v.astype(values.dtype))

        # Visible: the committed prefix, and tree slots that are ancestors-or-self (pallas_kernels/tree_attention;
        # a chain, pallas_kernels/chain_attention).
        if tree.chain:
            out = cached_chain_attention(q, k, v, keys, values, start, tree.anc)
        else:
            out = cached_tree_attention(q, keys, values, start, tree.anc)
        out = out.reshape(b, n, cfg.num_heads * hd)
        out = out * jax.nn.sigmoid(gate.reshape(b, n, -1)).astype(out.dtype)
        return self.o_proj(out.astype(x.dtype), slices=slices), keys, values


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GDNPending:
    """What commit needs from one GDN layer's verify: per node, never a per-node state."""

    conv_in: jax.Array   # [B, N, C] pre-conv inputs
    k: jax.Array         # [B, N, Hk, Dk] fp32, l2-normalised
    delta: jax.Array     # [B, N, Hv, Dv] fp32
    G: jax.Array         # [B, N, Hv] fp32, log-decay cumulated along the path within the node's block
    s_mid: jax.Array     # [B, blocks-1, Hv, Dk, Dv] fp32 state entering blocks 1.. (chains only)


class GatedDeltaNet(nnx.Module):
    def __init__(self, cfg: TargetConfig, *, rngs):
        dt, d = cfg.jnp_dtype, cfg.hidden_size
        hv = cfg.linear_num_value_heads
        self.cfg = cfg
        self.in_proj = Linear(d, sum(part_widths(cfg, "in_proj")), dtype=dt, rngs=rngs)   # qkv | z | b | a
        # Depthwise causal conv, kernel [K, C]; tap K-1 multiplies the current token.
        self.conv1d = _init(rngs, (cfg.conv_kernel, cfg.conv_dim), dt, std=0.5)
        self.dt_bias = nnx.Param(jnp.ones((hv,), dt))
        self.A_log = nnx.Param(jnp.log(jax.random.uniform(rngs.params(), (hv,), jnp.float32, 1, 16)).astype(dt))
        self.norm = RMSNorm(cfg.linear_value_head_dim, eps=cfg.rms_norm_eps, offset=0.0, dtype=dt)
        self.out_proj = Linear(cfg.value_dim, d, dtype=dt, rngs=rngs)

    def __call__(self, x, history, s0, tree: Tree, row_scale=None, commit_n=None, slices=0):
        """`row_scale`, `slices` as in MLP. Returns (y, GDNPending), or with commit_n [B] (a chain: `Qwen35`'s
        commit_n) (y, (conv history, state)) after its first commit_n[b] tokens."""
        cfg = self.cfg
        if x.shape[1] == 1 and gdn_decode_api.resolve() != "reference" and commit_n is None:
            return self.decode(x, history, s0, row_scale, slices)
        b, n, _ = x.shape
        hv, dk, dv = cfg.linear_num_value_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim
        y = self.in_proj(x, row_scale)
        conv_in, z, _, _ = split_columns(cfg, "in_proj", y)
        z = z.reshape(b, n, hv, dv)
        # The conv along ancestors (node i's window: its ancestors at distance K-1, ..., 1, then itself; distances
        # past the root read the committed history of the last K-1 inputs), silu, l2 norms and gates, from y's
        # key-head groups (convert/keys.py `gdn_channel_order`: per key head h, q_h, k_h, then its value heads;
        # a tensor-parallel shard of whole groups holds all of its heads' channels). q and k stay at the key heads:
        # value head h reads key head h // (Hv / Hk).
        kw = cfg.conv_kernel
        rows = jnp.stack([window_index(tree, d, kw - 1) for d in range(kw)], 1)               # [B, K, N]
        q, k, v, g, beta = _gdn_tree_inputs(y, history, self.conv1d[...], self.A_log[...], self.dt_bias[...],
                                            rows, dk=dk, dv=dv)
        if commit_n is None:
            o, delta, G, s_mid = delta_rule(q, k, v, g, beta, tree, s0)
            after = GDNPending(conv_in, k, delta, G, s_mid)
        else:
            o, s1 = delta_rule(q, k, v, g, beta, tree, s0, commit_n)
            last = jnp.maximum(commit_n - 1, 0)
            (h1,) = _conv_commit((history,), (conv_in,), window_rows(tree, last, kw - 1), commit_n > 0)
            after = (h1, s1)
        o = self.norm(o.astype(x.dtype))
        o = (o * jax.nn.silu(z.astype(jnp.float32))).astype(x.dtype)
        return self.out_proj(o.reshape(b, n, cfg.value_dim), slices=slices), after

    def decode(self, x, history, s0, row_scale=None, slices=0):
        """The one-token step through the fused kernel (pallas_kernels/gdn_decode: the GPU default,
        JAXSPEC_GDN_DECODE forces either): the same outputs as __call__ on a one-node tree, in one kernel
        per layer between the in_proj and out_proj gemms; per shard under a mesh."""
        cfg = self.cfg
        b = x.shape[0]
        hv, dv, dk = cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.linear_key_head_dim
        conv_in, z, b_, a = split_columns(cfg, "in_proj", self.in_proj(x, row_scale))
        z = z.reshape(b, hv, dv)
        out, k, delta, g = sharding.per_shard_gdn_decode(
            functools.partial(gdn_decode, eps=cfg.rms_norm_eps), conv_in[:, 0], history, self.conv1d[...], z,
            a[:, 0], b_[:, 0], self.A_log[...], self.dt_bias[...], self.norm.weight[...], s0)
        s_mid = jnp.zeros((b, 0, hv, dk, dv), jnp.float32)
        pending = GDNPending(conv_in, k[:, None], delta[:, None], g[:, None], s_mid)
        return self.out_proj(out.reshape(b, 1, cfg.value_dim), slices=slices), pending


def out_slices(rows: int) -> int:
    """K slices the products in front of add_norm hand it for a block of `rows` rows (batch x nodes):
    pallas_kernels/add_rms_norm's slices_for (0, the product itself, unless its kernel runs), and 0 under a mesh,
    where a row-parallel product is summed across the model axis."""
    mesh = jax.sharding.get_abstract_mesh()
    return 0 if not mesh.empty and mesh.size > 1 else add_norm_api.slices_for(rows)


def add_norm(x, u, norm: RMSNorm):
    """(x + u, h, r) with h * r = norm(x + u): a residual add and the RMSNorm after it, its row scale r deferred
    to the product that h feeds (as RMSNorm.deferred): pallas_kernels/add_rms_norm, whose jnp reference XLA
    partitions under a mesh, and whose Pallas kernel (where JAXSPEC_ADD_RMS_NORM selects it) runs per shard. u is
    the update or the K slices of the product that made it (`out_slices`)."""
    fn = functools.partial(add_rms_norm, eps=norm.eps, offset=norm.offset)
    if add_norm_api.resolve() == "reference":
        return fn(x, u, norm.weight[...])
    return sharding.per_shard_rows(fn, x, u, norm.weight[...])


def window_index(tree: Tree, distance: int, hist: int):
    """Index into concat(history[hist], nodes[N]) of each node's conv input `distance` steps up."""
    anc = ancestor_at(tree, distance)
    return jnp.where(anc >= 0, hist + anc, hist + tree.depth - distance)


def window_rows(tree: Tree, last, hist: int):
    """The rows of concat(history[hist], nodes[N]) that make the conv history after node last [B]: its window of
    the last `hist` pre-conv inputs, oldest first. [B, hist] int32."""
    win = jnp.stack([window_index(tree, d, hist) for d in range(hist - 1, -1, -1)], 1)  # [B,hist,N]
    return jnp.take_along_axis(win, last[:, None, None].repeat(hist, 1), 2)[..., 0].astype(jnp.int32)


def cached_tree_attention(q, keys, values, start, anc):
    """`tree_attention` (pallas_kernels/tree_attention) for the target's and the drafter's full-attention
    layers. The Pallas kernel runs per shard (shard_map over batch and heads) under a mesh; the jnp
    reference is partitioned by GSPMD like the rest of the model."""
    if attention_api.resolve() != "reference":
        return sharding.per_shard_attention(tree_attention, q, keys, values, start, anc)
    return tree_attention(q, keys, values, start, anc)


def cached_chain_attention(q, k, v, keys, values, start, anc):
    """`chain_attention` (pallas_kernels/chain_attention) for the target's chains (prefill pieces, DFlash blocks):
    k, v [B, N, KV, hd] the chain's own keys and values, already in the cache. Where it resolves to the tree op
    (short chains, no GPU), exactly `cached_tree_attention`; else its kernels run per shard under a mesh."""
    name = chain_api.resolve(q, keys)
    if name == "tree":
        return cached_tree_attention(q, keys, values, start, anc)
    return sharding.per_shard_chain_attention(functools.partial(chain_attention, implementation=name), q,
                                              k.astype(keys.dtype), v.astype(values.dtype), keys, values, start)


def _gdn_tree_inputs(y, history, conv_w, A_log, dt_bias, rows, *, dk, dv):
    """`gdn_tree_inputs` (pallas_kernels/gdn_tree_inputs); the Pallas kernel runs per shard under a mesh, the jnp
    reference is partitioned by GSPMD like the rest of the model."""
    fn = functools.partial(gdn_tree_inputs, dk=dk, dv=dv)
    if gdn_tree_inputs_api.resolve(y.shape[1], dk, dv) != "reference":
        return sharding.per_shard_gdn_tree_inputs(fn, y, history, conv_w, A_log, dt_bias, rows)
    return fn(y, history, conv_w, A_log, dt_bias, rows)


def _conv_commit(hists, conv_ins, win, keep):
    """`conv_commit` (pallas_kernels/conv_commit: every GDN layer's conv history after a commit); the Pallas kernel
    (the GPU default, JAXSPEC_CONV_COMMIT) runs per shard under a mesh, the jnp reference is partitioned by GSPMD."""
    if conv_commit_api.resolve() != "reference":
        return sharding.per_shard_conv_commit(conv_commit, hists, conv_ins, win, keep)
    return conv_commit(hists, conv_ins, win, keep)


def _gdn_commit(s0s, w, k, delta, eg, keep):
    """`gdn_commit` (pallas_kernels/gdn_commit: every GDN layer's state update in a commit); the Pallas kernel
    (the GPU default, JAXSPEC_GDN_COMMIT) runs per shard under a mesh, the jnp reference is partitioned by GSPMD."""
    _, _, dk, dv = s0s[0].shape
    if gdn_commit_api.resolve(dk=dk, dv=dv, p=w.shape[2]) != "reference":
        return sharding.per_shard_commit(gdn_commit, s0s, w, k, delta, eg, keep)
    return gdn_commit(s0s, w, k, delta, eg, keep)


def _tree_delta_rule(q, k, v, g, beta, anc, s0):
    """The Pallas kernels run per shard: under a mesh with a tensor- or data-parallel axis they go through
    shard_map over (batch, heads); the jnp solvers are partitioned by GSPMD like the rest of the model."""
    if resolve(q.shape[1]) in ("pallas_triton", "pallas_interpret"):
        return sharding.per_shard(tree_delta_rule, q, k, v, g, beta, anc, s0)
    return tree_delta_rule(q, k, v, g, beta, anc, s0)


def _chain_delta_rule(q, k, v, g, beta, s0):
    """`chain_delta_rule` (pallas_kernels/tree_delta_rule/chain.py); its kernels run per shard under a mesh, as
    the tree delta rule's do."""
    if resolve(CHUNK) in ("pallas_triton", "pallas_interpret"):
        return sharding.per_shard_chain(functools.partial(chain_delta_rule, chunk=CHUNK), q, k, v, g, beta, s0)
    return chain_delta_rule(q, k, v, g, beta, s0, chunk=CHUNK)


def delta_rule(q, k, v, g, beta, tree: Tree, s0, commit_n=None):
    """Trees run as one block; chains in blocks of CHUNK with the state carried between blocks.

    Returns (o, delta, G, s_mid) for `commit`; with commit_n [B] (a chain), (o, s1): s1 the state after token
    commit_n - 1 (s0 where commit_n = 0). A chain longer than a block with commit_n (a prefill) goes through
    `chain_delta_rule`, its tokens from commit_n on made inert (g = beta = 0), so that its last state is s1."""
    n = q.shape[1]
    b = q.shape[0]
    if commit_n is not None and tree.chain and n > CHUNK:
        live = (jnp.arange(n)[None] < commit_n[:, None])[..., None]                  # [B, N, 1]
        return _chain_delta_rule(q, k, v, jnp.where(live, g, 0.0), jnp.where(live, beta, 0.0), s0)
    if not tree.chain or n <= CHUNK:
        o, delta, G = _tree_delta_rule(q, k, v, g, beta, tree.anc, s0)
        if commit_n is not None:
            s0, last = s0.astype(jnp.float32), jnp.maximum(commit_n - 1, 0)             # [B]
            s1 = state_at(s0, k, delta, G, jnp.arange(n)[None] <= last[:, None],
                          jnp.take_along_axis(G, last[:, None, None], 1)[:, 0])
            return o, jnp.where((commit_n > 0)[:, None, None, None], s1, s0)
        return o, delta, G, jnp.zeros((s0.shape[0], 0) + s0.shape[1:], jnp.float32)
    nb = -(-n // CHUNK)
    pad = nb * CHUNK - n
    # Padded nodes have beta = 0 and g = 0: they leave the state untouched.
    q, k, v, g, beta = (jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)) for x in (q, k, v, g, beta))
    blocks = tuple(x.reshape((x.shape[0], nb, CHUNK) + x.shape[2:]).swapaxes(0, 1) for x in (q, k, v, g, beta))
    anc = jnp.broadcast_to(jnp.tril(jnp.ones((CHUNK, CHUNK), bool)), (b, CHUNK, CHUNK))
    every = jnp.ones((b, CHUNK), bool)
    unblock = lambda x: x.swapaxes(0, 1).reshape((b, nb * CHUNK) + x.shape[3:])[:, :n]

    def step(s, blk):
        qb, kb, vb, gb, bb = blk
        o, delta, G = _tree_delta_rule(qb, kb, vb, gb, bb, anc, s)
        return state_at(s, kb, delta, G, every, G[:, -1]), (o, delta, G, s)

    _, (o, delta, G, s_in) = jax.lax.scan(step, s0.astype(jnp.float32), blocks)
    return unblock(o), unblock(delta), unblock(G), s_in[1:].swapaxes(0, 1)


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: TargetConfig, layer_type: str, *, rngs):
        dt = cfg.jnp_dtype
        self.is_full = layer_type == FULL
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, offset=1.0, dtype=dt)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, offset=1.0, dtype=dt)
        if self.is_full:
            self.self_attn = Attention(cfg, rngs=rngs)
        else:
            self.linear_attn = GatedDeltaNet(cfg, rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """Committed decoding state of a batch. Per-layer tuples: layers are unrolled (DESIGN.md section 5)."""

    length: jax.Array               # [B] int32 committed tokens
    keys: tuple[jax.Array, ...]     # per full layer [B, L, KV, hd]
    values: tuple[jax.Array, ...]
    conv: tuple[jax.Array, ...]     # per GDN layer [B, K-1, C] last pre-conv inputs
    ssm: tuple[jax.Array, ...]      # per GDN layer [B, Hv, Dk, Dv] fp32

    @property
    def max_len(self) -> int:
        """Tokens the KV cache holds; a model without full-attention layers has no limit (int32 max)."""
        return self.keys[0].shape[1] if self.keys else 2**31 - 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Pending:
    """A verified tree not yet committed: the GDN per-node terms (attention K/V are already in the
    state's tree slots)."""

    gdn: tuple[GDNPending, ...]


class Qwen35(nnx.Module):
    """The text model: embed -> decoder layers -> (1 + w) norm -> untied lm_head."""

    def __init__(self, cfg: TargetConfig, *, rngs: nnx.Rngs):
        dt = cfg.jnp_dtype
        self.cfg = cfg
        self.embed_tokens = _init(rngs, (cfg.vocab_rows, cfg.hidden_size), dt)
        self.layers = nnx.List([DecoderLayer(cfg, t, rngs=rngs) for t in cfg.layer_types])
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, offset=1.0, dtype=dt)
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_rows, dtype=dt, rngs=rngs)

    def init_state(self, batch: int, max_len: int) -> State:
        return init_state(self.cfg, batch, max_len)

    def embed(self, tokens):
        # Invalid tree nodes carry token -1 (never accepted); any row will do for them.
        return sharding.vocab_rows(self.embed_tokens[...], jnp.clip(tokens, 0, self.cfg.vocab_size - 1))

    def unembedding(self):
        """The lm_head kernel [D, V] (the embedding's transpose when tied); the drafter shares it."""
        return self.embed_tokens[...].T if self.cfg.tie_word_embeddings else self.lm_head.kernel[...]

    def logits(self, h):
        """Final norm + lm_head, in fp32. h [..., D] is the residual stream."""
        h, r = self.norm.deferred(h)
        return mask_vocab(jnp.einsum("...d,dv->...v", h, self.unembedding()).astype(jnp.float32) * r,
                          self.cfg.vocab_size)

    def __call__(self, tokens, state: State, tree: Tree, *, taps=(), logit_index=None, commit_n=None):
        """Verify forward of a tree of N tokens per sequence on top of `state`.

        tokens [B,N]; node i sits at RoPE position length + depth[i] and sees the committed prefix plus
        its ancestors-or-self. Returns (logits [B,N,V] or [B,V] at `logit_index` [B], taps
        [B,N,len(taps),D] = outputs of those decoder layers as transformers' hidden_states[i + 1] gives them, which
        z-lab's drafters read (the last layer's after the final norm: HF's last entry), state with the tree's K/V
        written to slots length..length+N-1, Pending for `commit`).

        commit_n [B] (a chain only: a prefill): commit the first commit_n[b] tokens as the forward goes: each GDN
        layer takes its state after token commit_n[b] - 1 from the delta rule itself (`delta_rule`: past one block,
        the chain delta rule with the tokens after commit_n[b] made inert), so that none of the per-token terms
        `commit` needs (~100 KB a token a layer at the real shape) is kept. Returns the
        committed state (what `commit` gives with the path 0..N-1) and an empty Pending.
        """
        if commit_n is not None and not tree.chain:
            raise ValueError("commit_n commits a chain as the forward goes; a tree's path is known only after "
                             "verification (use commit)")
        start = state.length
        positions = start[:, None] + tree.depth
        x = self.embed(tokens)
        keys, values, pend, tapped = list(state.keys), list(state.values), [], {}
        conv, ssm = list(state.conv), list(state.ssm)
        fi = li = 0
        h, r = self.layers[0].input_layernorm.deferred(x)   # each norm's scale r is taken after its product
        sl = out_slices(tokens.size)              # the products in front of each add_norm as K slices, or whole
        for i, layer in enumerate(self.layers):
            if layer.is_full:
                h, keys[fi], values[fi] = layer.self_attn(h, keys[fi], values[fi], start, positions, tree, r, sl)
                fi += 1
            else:
                h, p = layer.linear_attn(h, state.conv[li], state.ssm[li], tree, r, commit_n, sl)
                if commit_n is None:
                    pend.append(p)
                else:
                    conv[li], ssm[li] = p
                li += 1
            x, h, r = add_norm(x, h, layer.post_attention_layernorm)
            h = layer.mlp(h, r, sl)
            if i + 1 < len(self.layers):                 # the next layer's input norm, with this residual add
                x, h, r = add_norm(x, h, self.layers[i + 1].input_layernorm)
            else:
                x = add(x, h)
            if i in taps:       # the last layer's as HF's last hidden_states entry, after the final norm
                tapped[i] = x if i + 1 < len(self.layers) else self.norm(x)
        if logit_index is not None:
            x = jnp.take_along_axis(x, logit_index[:, None, None], 1)[:, 0]
        tap_out = jnp.stack([tapped[i] for i in taps], 2) if taps else None
        new = dataclasses.replace(state, keys=tuple(keys), values=tuple(values))
        if commit_n is not None:
            new = dataclasses.replace(new, length=start + commit_n, conv=tuple(conv), ssm=tuple(ssm))
        return self.logits(x), tap_out, new, Pending(tuple(pend))


def mask_vocab(logits, vocab_size: int):
    """-inf at the padding columns a tensor-parallel vocabulary adds past `vocab_size` (none unsharded)."""
    if logits.shape[-1] == vocab_size:
        return logits
    return jnp.where(jnp.arange(logits.shape[-1]) < vocab_size, logits, -jnp.inf)


def init_state(cfg: TargetConfig, batch: int, max_len: int) -> State:
    dt = cfg.jnp_dtype
    nf, nl = len(cfg.full_layers), len(cfg.linear_layers)
    kv = lambda: jnp.zeros((batch, max_len, cfg.num_kv_heads, cfg.head_dim), dt)
    return State(
        length=jnp.zeros((batch,), jnp.int32),
        keys=tuple(kv() for _ in range(nf)),
        values=tuple(kv() for _ in range(nf)),
        conv=tuple(jnp.zeros((batch, cfg.conv_kernel - 1, cfg.conv_dim), dt) for _ in range(nl)),
        ssm=tuple(jnp.zeros((batch, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                             cfg.linear_value_head_dim), jnp.float32) for _ in range(nl)),
    )


def commit(state: State, pending: Pending, tree: Tree, path, n) -> State:
    """Fold an accepted root-to-node path into the state.

    path [B, P]: node indices of the accepted path (path[:, k] has depth k), valid for k < n [B]; P <= N
    (accept gives P = tree.longest_path: a DDTree drafted 15 deep has paths of at most 16 of its 65 nodes, and
    only those are moved and folded in). A sequence with n = 0 keeps its state (a finished sequence, or a
    prompt shorter than this piece).
    Attention: tree-slot rows start + path[k] move to start + k (their RoPE positions, start + depth,
    are already right). GDN: the state after the last accepted node is rebuilt from its block's
    entering state and the per-node deltas; the conv history becomes that node's window.
    """
    start = state.length
    b, nn = tree.parent.shape
    keep = n > 0
    last = jnp.take_along_axis(path, jnp.maximum(n - 1, 0)[:, None], 1)[:, 0]         # [B]
    keys, values = state.keys, state.values
    reach = path.shape[1]
    if not tree.chain:
        rows = jnp.arange(b)[:, None]
        src = start[:, None] + path
        dst = jnp.where(jnp.arange(reach)[None] < n[:, None], start[:, None] + jnp.arange(reach)[None], state.max_len)
        move = lambda c: c.at[rows, dst].set(c[rows, jnp.clip(src, 0, state.max_len - 1)], mode="drop")
        keys, values = tuple(map(move, keys)), tuple(map(move, values))

    block = last // CHUNK if tree.chain else jnp.zeros_like(last)
    bases, g_lasts = [], []
    for s0, p in zip(state.ssm, pending.gdn):
        base = s0
        if p.s_mid.shape[1]:
            mids = jnp.concatenate([s0[:, None], p.s_mid], 1)
            base = jnp.take_along_axis(mids, block[:, None, None, None, None], 1)[:, 0]
        bases.append(base)
        g_lasts.append(jnp.take_along_axis(p.G, last[:, None, None], 1)[:, 0])
    conv, ssm = state.conv, state.ssm
    if pending.gdn:     # every GDN layer's conv history and state after the last accepted node, each in one update
        gdn = pending.gdn
        conv = _conv_commit(conv, [p.conv_in for p in gdn], window_rows(tree, last, conv[0].shape[1]), keep)
        if not tree.chain and reach < nn:        # over the path's nodes only, not every node of the tree
            nodes, anc_row = path, jnp.arange(reach)[None] < n[:, None]
        elif tree.chain and nn > CHUNK:          # over the last node's block only (a prefill piece's chain)
            at = block[:, None] * CHUNK + jnp.arange(CHUNK)[None]                                  # [B, CHUNK]
            nodes, anc_row = jnp.minimum(at, nn - 1), at <= last[:, None]
        else:                                    # the last node's ancestors among all nodes
            nodes, anc_row = None, jnp.take_along_axis(tree.anc, last[:, None, None], 1)[:, 0]      # [B,N]
        terms = path_terms([p.k for p in gdn], [p.delta for p in gdn], [p.G for p in gdn], anc_row, g_lasts, nodes)
        ssm = _gdn_commit(bases, *terms, keep)   # a sequence not kept has block 0: its base is its s0
    return State(start + n, keys, values, tuple(conv), tuple(ssm))
