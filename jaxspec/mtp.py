"""The checkpoint's own multi-token-prediction (MTP) head as a speculator on the one engine
(reference/qwen36.md section 3.8; public reference: vLLM `qwen3_5_mtp.py` and its EAGLE-style proposer).

Row t of the head pairs the target's final-normed hidden state h_t with the token after it:

    u_t = fc([pre_fc_norm_embedding(embed(token_{t+1})) ; pre_fc_norm_hidden(h_t)])     # embedding first
    x_t = one gated-attention decoder layer over rows 0..t (the head's own KV cache)
    o_t = norm(x_t);  logits_t = lm_head(o_t)                                             # predicts token_{t+2}

embed and lm_head are the target's. Drafting k tokens recurses: row t+1 pairs o_t with the token just
drafted from logits_t. Conventions (the reference notes leave both open; vLLM pins them):

- The recursive hidden state is o_t, the output *after* `mtp.norm` (vLLM's MTP forward returns the
  normed state; its proposer feeds that same tensor back as the next step's hidden state, where
  `pre_fc_norm_hidden` normalises it again).
- Row t sits at RoPE position t, the position of its hidden state (vLLM passes the target's positions
  unchanged and shifts only the token ids). The reference notes say "RoPE at t+1": every query and
  every cached key of the head's one attention layer would move by the same +1, and attention sees only
  position differences, so both give the same drafts (tests/test_mtp.py checks this); they differ only
  in the cached keys themselves.

Where each row is computed (the engine hands `start`/`update` the target's taps; the last decoder layer's
output followed by the target's final norm is h_t): a committed row t can only be run once token_{t+1}
is known. For the last committed row that token is the pending bonus, which `update` never sees. So
`update` only stores the accepted rows' hidden states and tokens, and `propose` runs them, with the
pending token closing the last one, as the first draft step (one chain forward of up to k+1 rows, which
costs one row's weight reads; as in vLLM, this saves a separate head pass per round). Prefill pieces
are run in `start`, all rows but the last. Interface change for this: `start` receives the piece's
tokens, since prompt tokens reach a speculator nowhere else.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxspec import tree as trees
from jaxspec.config import FULL, ConfigError, TargetConfig
from jaxspec.engine import Proposal, Speculator, int_arg
from jaxspec.model import DecoderLayer, Linear, RMSNorm, mask_vocab
from jaxspec.sampling import categorical, log_probs

# Fields of the target config that the head's weights are shaped by.
_SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "rotary_dim",
                 "rope_theta", "rms_norm_eps")


class MTPHead(nnx.Module):
    """`mtp.*`: pre_fc_norm_embedding, pre_fc_norm_hidden, fc [2D -> D], layers.0 (a target full-attention
    decoder layer), norm; all norms (1 + w). Parameter paths mirror the checkpoint keys without `mtp.`."""

    def __init__(self, cfg: TargetConfig, *, rngs: nnx.Rngs):
        dt, d = cfg.jnp_dtype, cfg.hidden_size
        self.cfg = cfg
        self.pre_fc_norm_embedding = RMSNorm(d, eps=cfg.rms_norm_eps, offset=1.0, dtype=dt)
        self.pre_fc_norm_hidden = RMSNorm(d, eps=cfg.rms_norm_eps, offset=1.0, dtype=dt)
        self.fc = Linear(2 * d, d, dtype=dt, rngs=rngs)
        self.layers = nnx.List([DecoderLayer(cfg, FULL, rngs=rngs)])
        self.norm = RMSNorm(d, eps=cfg.rms_norm_eps, offset=1.0, dtype=dt)

    def __call__(self, emb, hidden, keys, values, start):
        """Rows start .. start+T-1 as a chain. emb [B,T,D]: embed(token_{t+1}); hidden [B,T,D]: h_t (the
        target's final-normed state, or the previous row's output when drafting); keys/values
        [B,L,KV,hd] the head's cache, rows before `start` [B] visible. Returns o [B,T,D] (after `norm`)
        and the cache with the T rows' K/V written at slots start .. start+T-1."""
        b, t, _ = emb.shape
        dt = self.cfg.jnp_dtype
        x = self.fc(jnp.concatenate([self.pre_fc_norm_embedding(emb.astype(dt)),
                                     self.pre_fc_norm_hidden(hidden.astype(dt))], -1))
        tree = trees.chain(b, t)
        layer = self.layers[0]
        h, keys, values = layer.self_attn(layer.input_layernorm(x), keys, values, start,
                                          start[:, None] + tree.depth, tree)
        x = x + h
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x), keys, values


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MTPCache:
    """The head's decoding state. Rows 0 .. length-1 have their K/V in `keys`/`values` (slot = row). The
    next n_rows committed rows wait for their next token: hidden [B,R,D] their final-normed target
    states, next_tok [B,R] the token after each (the last one's is the pending token, given to
    `propose`). After `update`, length + n_rows is the target's committed length."""

    length: jax.Array      # [B] int32
    keys: jax.Array        # [B, L, KV, hd], post k_norm and RoPE
    values: jax.Array
    hidden: jax.Array      # [B, R, D], R = k + 1 (a round commits at most k + 1 rows)
    next_tok: jax.Array    # [B, R] int32
    n_rows: jax.Array      # [B] int32
    drafts: jax.Array      # [B, k + 1] the chain last proposed; `update` takes the accepted tokens from it


def init_cache(cfg: TargetConfig, batch: int, max_len: int, rows: int) -> MTPCache:
    dt = cfg.jnp_dtype
    kv = lambda: jnp.zeros((batch, max_len, cfg.num_kv_heads, cfg.head_dim), dt)
    zi = jnp.zeros((batch,), jnp.int32)
    return MTPCache(zi, kv(), kv(), jnp.zeros((batch, rows, cfg.hidden_size), dt), jnp.zeros((batch, rows), jnp.int32),
                    zi, jnp.zeros((batch, rows), jnp.int32))


def check_head(head_cfg: TargetConfig, target: TargetConfig) -> None:
    bad = [f"{f}: head {getattr(head_cfg, f)} vs target {getattr(target, f)}" for f in _SHAPE_FIELDS
           if getattr(head_cfg, f) != getattr(target, f)]
    if not bad:
        return
    # A target laid out for tensor parallelism repeats its kv heads up to the degree (sharding.tp_config): the
    # degree is then its kv head count, and an unsharded head of that target differs from it there alone.
    from jaxspec.sharding import tp_config
    tp = target.num_kv_heads
    if tp > head_cfg.num_kv_heads and all(getattr(tp_config(head_cfg, tp), f) == getattr(target, f)
                                          for f in _SHAPE_FIELDS):
        raise ConfigError(f"the MTP head is not laid out like this target ({'; '.join(bad)}): the target is "
                          f"sharded for tensor parallelism {tp}, with its kv heads repeated; lay the head out on the "
                          f"target's mesh with jaxspec.sharding.shard_mtp(head, mesh)")
    raise ConfigError(f"the MTP head does not belong to this target ({'; '.join(bad)})")


class MTP(Speculator):
    """A chain [pending, m1 .. mk] from k recursive head steps; greedy drafts are the head's argmax,
    sampled drafts m_j ~ q_j (the head's logits under the same sampling transform as the target's) with
    q passed on for rejection sampling."""

    name = "mtp"
    layout = ("MTP head", "head", "shard_mtp")
    # the head runs in the target's residual stream with its own attention layer: `Engine` compares these too
    target_fields = Speculator.target_fields + tuple(f for f in _SHAPE_FIELDS if f not in Speculator.target_fields)

    def __init__(self, head: MTPHead, target: TargetConfig, tokens: int):
        tokens = int_arg(tokens, "--mtp-tokens", ConfigError)
        if tokens < 1:
            raise ConfigError(f"--mtp-tokens {tokens}: must be >= 1 (draft tokens per round)")
        check_head(head.cfg, target)
        self.cfg, self.k, self.target_cfg = head.cfg, tokens, target
        self.tree_size = self.k + 1
        # h_t = final norm of the last decoder layer's output: the model's tap of its last layer is taken after
        # the final norm (HF's hidden_states[-1]), so it is used as it comes.
        self.taps = (target.num_layers - 1,)
        self.graphdef, self.params = nnx.split(head)

    def _head(self, params) -> MTPHead:
        return nnx.merge(self.graphdef, params)

    def init(self, batch, max_len):
        return init_cache(self.cfg, batch, max_len, self.tree_size)

    def start(self, params, model, cache: MTPCache, taps, n, tokens):
        # Prefill runs before any round, so at most one row (the previous piece's last) is waiting, and
        # this piece's tokens are, in order, the next tokens of that row and of the piece's own rows.
        h = taps[:, :, 0]                                  # [B, P, D], the last layer's tap: final-normed
        b, p = tokens.shape
        hid = jnp.concatenate([cache.hidden[:, :1].astype(h.dtype), h], 1)        # [B, 1+P, D]
        nxt = jnp.concatenate([tokens, jnp.zeros((b, 1), tokens.dtype)], 1)       # row j's next token
        carried = jnp.minimum(cache.n_rows, 1)
        idx = (1 - carried)[:, None] + jnp.arange(p, dtype=jnp.int32)[None]       # skip the empty slot
        rows = jnp.take_along_axis(hid, idx[..., None], 1)
        o, keys, values = self._head(params)(model.embed(jnp.take_along_axis(nxt, idx, 1)), rows,
                                             cache.keys, cache.values, cache.length)
        # Rows past `count` wrote K/V at slots >= the new length: invisible until a later call rewrites them.
        has = n > 0
        count = jnp.where(has, carried + n - 1, 0)
        last = jnp.take_along_axis(h, jnp.maximum(n - 1, 0)[:, None, None], 1)[:, 0]
        hidden = cache.hidden.at[:, 0].set(jnp.where(has[:, None], last, cache.hidden[:, 0]).astype(cache.hidden.dtype))
        return dataclasses.replace(cache, length=cache.length + count, keys=keys, values=values, hidden=hidden,
                                   n_rows=jnp.where(has, 1, cache.n_rows))

    def propose(self, params, model, cache: MTPCache, pending, key, sampling):
        head = self._head(params)
        b, r = cache.next_tok.shape
        last = jnp.maximum(cache.n_rows - 1, 0)
        # Step 1: the waiting rows, the last closed by the pending token; its output predicts m1.
        nxt = jnp.where(jnp.arange(r)[None] == last[:, None], pending[:, None], cache.next_tok)
        o, keys, values = head(model.embed(nxt), cache.hidden, cache.keys, cache.values, cache.length)
        o = jnp.take_along_axis(o, last[:, None, None], 1)                         # [B, 1, D]
        length = cache.length + cache.n_rows                                       # = the target's length
        lm_head = model.unembedding()
        drafts, logq = [], []
        for j, kj in enumerate(jax.random.split(key, self.k)):
            logits = mask_vocab(jnp.einsum("bd,dv->bv", o[:, 0], lm_head.astype(o.dtype)).astype(jnp.float32),
                                model.cfg.vocab_size)
            if sampling.greedy:
                m = jnp.argmax(logits, -1).astype(jnp.int32)
            else:
                lq = log_probs(logits, sampling)
                m = categorical(kj, lq)
                logq.append(lq)
            drafts.append(m)
            if j + 1 < self.k:
                # Row length + j: the previous output with the token drafted from it. Its K/V land past
                # the committed rows, where the next round's real rows overwrite them.
                o, keys, values = head(model.embed(m[:, None]), o, keys, values, length + j)
        tokens = jnp.stack([pending.astype(jnp.int32)] + drafts, 1)
        lq = None if sampling.greedy else jnp.stack([jnp.zeros_like(logq[0])] + logq, 1)
        cache = dataclasses.replace(cache, length=length, keys=keys, values=values,
                                    n_rows=jnp.zeros_like(cache.n_rows), drafts=tokens)
        return Proposal(tokens, trees.chain(b, self.tree_size), lq), cache

    def update(self, params, model, cache: MTPCache, taps, path, n):
        # Accepted row i pairs with the token of accepted node i+1; the last one's is the bonus, which
        # the next `propose` receives as the pending token.
        h = jnp.take_along_axis(taps[:, :, 0], path[..., None], 1)                # final-normed already
        nxt = jnp.take_along_axis(cache.drafts, jnp.roll(path, -1, 1), 1)
        return dataclasses.replace(cache, hidden=h.astype(cache.hidden.dtype), next_tok=nxt, n_rows=n)
