# Where inside layer 0 (a GDN layer) of the demo target do a chain of 8 tokens and 8 one-token steps part (bf16)?
# Same setup as ../2026-12-03-cpu-s32-bf16/rowinv.py: a 64-token prompt from jaxspec/train.py is prefilled and
# committed, then its next 8 tokens go through layer 0 as one chain, and as 8 steps with a commit after each.
# The layer's forward is spelled out below, piece by piece as GatedDeltaNet.__call__ computes it, to return every
# intermediate; the commit is jaxspec.model.commit on this one layer. CHUNK_OVERRIDE sets jaxspec.model.CHUNK first.
#   PYTHONPATH=. python bench/results/2026-12-03-cpu-s33-exact-bf16/gdnprobe.py OUT.json
import dataclasses
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec.model as model
from convert.hf import load_target
from jaxspec import tree as trees
from jaxspec.tokenizer import load_tokenizer

if "CHUNK_OVERRIDE" in os.environ:
    model.CHUNK = int(os.environ["CHUNK_OVERRIDE"])
t = load_target("jaxspec/demo/target", dtype="bfloat16")
cfg = t.cfg
l0 = t.layers[0]
la = l0.linear_attn
ids = load_tokenizer("jaxspec/demo/target").encode(open("jaxspec/train.py").read())[:72]
prompt, cont = ids[:64], ids[64:72]


def layer0(tokens, conv, ssm, tr):
    b, n = tokens.shape
    hk, hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    x = t.embed(tokens)
    h = l0.input_layernorm(x)
    conv_in = la.in_proj_qkv(h)
    z = la.in_proj_z(h).reshape(b, n, hv, dv)
    beta = jax.nn.sigmoid(la.in_proj_b(h)).astype(jnp.float32)
    a = la.in_proj_a(h).astype(jnp.float32)
    g = -jnp.exp(la.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a + la.dt_bias[...].astype(jnp.float32))
    rep = hv // hk
    qkv_conv = la.conv(conv_in, conv, tr)
    qkv = qkv_conv.reshape(b, n, hk, 2 * dk + rep * dv)
    q = model.l2norm(qkv[..., :dk].astype(jnp.float32)) * dk ** -0.5
    k = model.l2norm(qkv[..., dk:2 * dk].astype(jnp.float32))
    v = qkv[..., 2 * dk:].reshape(b, n, hv, dv).astype(jnp.float32)
    o, delta, G, s_mid = model.delta_rule(jnp.repeat(q, rep, 2), jnp.repeat(k, rep, 2), v, g, beta, tr, ssm)
    on = la.norm(o.astype(x.dtype))
    gated = (on * jax.nn.silu(z.astype(jnp.float32))).astype(x.dtype)
    out = la.out_proj(gated.reshape(b, n, cfg.value_dim))
    res, h2 = model.add_norm(x, out, l0.post_attention_layernorm)
    mlp = l0.mlp(h2)
    pieces = dict(h=h, conv_in=conv_in, z=z, beta=beta, g=g, qkv_conv=qkv_conv, q=q, k=k, v=v, o=o, delta=delta,
                  o_normed=on, gated=gated, out_proj=out, post_norm=h2, mlp=mlp, layer_out=res + mlp)
    return pieces, model.GDNPending(conv_in, k, delta, G, s_mid)


def step(tokens, state, tr, path, n):
    pieces, pend = layer0(tokens, state.conv[0], state.ssm[0], tr)
    one = dataclasses.replace(state, conv=state.conv[:1], ssm=state.ssm[:1])
    return pieces, model.commit(cfg, one, model.Pending((pend,)), tr, path, n)


step = jax.jit(step)
st = model.init_state(cfg, 1, 128)
st = dataclasses.replace(st, conv=st.conv[:1], ssm=st.ssm[:1])
_, st = step(jnp.asarray([prompt]), st, trees.chain(1, 64), jnp.arange(64)[None], jnp.asarray([64]))
chain, _ = step(jnp.asarray([cont]), st, trees.chain(1, 8), jnp.arange(8)[None], jnp.asarray([8]))
steps, s = [], st
for tok in cont:
    p, s = step(jnp.asarray([[tok]]), s, trees.chain(1, 1), jnp.zeros((1, 1), jnp.int32), jnp.asarray([1]))
    steps.append(p)
out = {"CHUNK": model.CHUNK}
for name in chain:
    a = np.asarray(chain[name][0], np.float32)
    b = np.concatenate([np.asarray(p[name][0], np.float32) for p in steps])
    out[name] = float(np.mean(a != b))
    print(f"{name:10s} elements differing (chain of 8 vs 8 steps): {out[name]:.5f}")
json.dump(out, open(sys.argv[1], "w"), indent=1)
