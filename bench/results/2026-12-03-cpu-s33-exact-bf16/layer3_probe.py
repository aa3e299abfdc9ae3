# chain_probe.py's first differing point is row 8 of the first chain, at layer 3 (the first attention layer). Here
# that layer's pieces for that row: the chain's 16 rows against the one-token step, from the same inputs (layer 2's
# output, bit-equal there) and the same committed state. Run under exact.py.
#   PYTHONPATH=. python bench/results/2026-12-03-cpu-s33-exact-bf16/exact.py \
#       bench/results/2026-12-03-cpu-s33-exact-bf16/layer3_probe.py OUT.json [ROW]
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec.model as model
from convert.hf import load_target
from jaxspec import tree as trees
from jaxspec.engine import Engine
from jaxspec.tokenizer import load_tokenizer

row = int(sys.argv[2]) if len(sys.argv) > 2 else 8
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from windows import windows  # noqa: E402

t = load_target("jaxspec/demo/target", dtype="bfloat16")
cfg = t.cfg
tok = load_tokenizer("jaxspec/demo/target")
prompts = windows(tok)
p = prompts[15]
a = [int(x) for x in Engine(t, None, stop_tokens=()).generate([p], 17, max_len=300).tokens[0]]
taps = tuple(range(cfg.num_layers))
fwd = jax.jit(lambda tokens, state, tr: t(tokens, state, tr, taps=taps))
com = jax.jit(lambda s, pend, tr, path, n: model.commit(cfg, s, pend, tr, path, n))


def run(tokens, state):
    tr = trees.chain(1, len(tokens))
    _, tp, s, pend = fwd(jnp.asarray([tokens]), state, tr)
    n = len(tokens)
    return tp, com(s, pend, tr, jnp.arange(n)[None], jnp.asarray([n]))


_, st = run(p, model.init_state(cfg, 1, 300))
s = st
for x in a[:row]:
    _, s = run([x], s)
li = 3
layer = t.layers[li]
att = layer.self_attn


@jax.jit
def pieces(x, keys, values, start, tr):
    """Layer 3 on x [1, N, D] (its input residual), as DecoderLayer runs it, every intermediate returned."""
    b, n, _ = x.shape
    hd, kvh = cfg.head_dim, cfg.num_kv_heads
    h = layer.input_layernorm(x)
    positions = start[:, None] + tr.depth
    qg = att.q_proj(h).reshape(b, n, cfg.num_heads, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:]
    q = model.rope(att.q_norm(q), positions, cfg.rotary_dim, cfg.rope_theta)
    k = model.rope(att.k_norm(att.k_proj(h).reshape(b, n, kvh, hd)), positions, cfg.rotary_dim, cfg.rope_theta)
    v = att.v_proj(h).reshape(b, n, kvh, hd)
    slots = start[:, None] + jnp.arange(n, dtype=jnp.int32)
    keys = keys.at[jnp.arange(b)[:, None], slots].set(k.astype(keys.dtype))
    values = values.at[jnp.arange(b)[:, None], slots].set(v.astype(values.dtype))
    core = model.cached_tree_attention(q, keys, values, start, tr.anc).reshape(b, n, cfg.num_heads * hd)
    gated = core * jax.nn.sigmoid(gate.reshape(b, n, -1)).astype(core.dtype)
    o = att.o_proj(gated.astype(x.dtype))
    x2, h2 = model.add_norm(x, o, layer.post_attention_layernorm)
    mlp = layer.mlp(h2)
    return dict(keys=keys, values=values, h=h, q=q, k=k, v=v, core=core, gated=gated, o_proj=o, post_norm=h2, mlp=mlp, out=x2 + mlp)


tp_chain, _ = run(a[:16], st)                      # layer 2's output for the 16 chain rows
tp_step, _ = run([a[row]], s)                      # and for the row alone, from the state after `row` steps
x_chain = tp_chain[:, :, li - 1]
x_step = tp_step[:, :, li - 1]
out = {"row": row, "input_equal": bool(np.all(np.asarray(x_chain[0, row]) == np.asarray(x_step[0, 0])))}
fi = 0                                             # layer 3 is the first full-attention layer
c = pieces(x_chain, st.keys[fi], st.values[fi], st.length, trees.chain(1, 16))
o = pieces(x_step, s.keys[fi], s.values[fi], s.length, trees.chain(1, 1))
seen = int(st.length[0]) + row + 1                  # the cache slots row `row` sees
for name in c:
    if name in ("keys", "values"):
        a_, b_ = np.asarray(c[name][0, :seen], np.float32), np.asarray(o[name][0, :seen], np.float32)
    else:
        a_, b_ = np.asarray(c[name][0, row], np.float32), np.asarray(o[name][0, 0], np.float32)
    out[name] = float(np.mean(a_ != b_))
kc, ks = np.asarray(c["keys"][0, :seen], np.float32), np.asarray(o["keys"][0, :seen], np.float32)
out["key_slots_differing"] = [i for i in range(seen) if np.any(kc[i] != ks[i])]
print(json.dumps(out))
json.dump(out, open(sys.argv[1], "w"), indent=1)
