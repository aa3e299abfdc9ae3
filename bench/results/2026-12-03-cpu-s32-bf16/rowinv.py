"""bf16: does row k of an N-row pass give the same bits as the same row run alone? Matmul alone, then each layer
of the demo target (chain of N teacher-forced tokens vs N one-token steps from the same state)."""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from convert.hf import load_target
from jaxspec import tree as trees
from jaxspec.model import commit, init_state
from jaxspec.tokenizer import load_tokenizer

out = {}
rng = np.random.default_rng(0)
for m in (1, 8, 17, 65):
    x = jnp.asarray(rng.standard_normal((m, 384)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((384, 1152)) * 0.05, jnp.bfloat16)
    full = jax.jit(lambda x, w: x @ w)(x, w)
    alone = jnp.concatenate([jax.jit(lambda x, w: x @ w)(x[i:i + 1], w) for i in range(m)])
    out[f"matmul_m{m}_rows_bitwise_equal"] = float(np.mean(np.all(np.asarray(full) == np.asarray(alone), 1)))
print(out)

t = load_target("jaxspec/demo/target", dtype=sys.argv[1])
tok = load_tokenizer("jaxspec/demo/target")
ids = tok.encode(open("jaxspec/train.py").read())[:80]
prompt, cont = ids[:64], ids[64:64 + 8]
taps = tuple(range(t.cfg.num_layers))
fwd = jax.jit(lambda tokens, state, tr: t(tokens, state, tr, taps=taps))
com = jax.jit(lambda s, p, tr, path, n: commit(t.cfg, s, p, tr, path, n))
st = init_state(t.cfg, 1, 128)
tr = trees.chain(1, 64)
_, _, s1, p1 = fwd(jnp.asarray([prompt]), st, tr)
st = com(s1, p1, tr, jnp.arange(64)[None], jnp.asarray([64]))
# the chain of 8 at once
tr8 = trees.chain(1, 8)
lg8, tp8, _, _ = fwd(jnp.asarray([cont]), st, tr8)
# 8 one-token steps
s = st
tr1 = trees.chain(1, 1)
lg1, tp1 = [], []
for k in range(8):
    lg, tp, s2, p2 = fwd(jnp.asarray([[cont[k]]]), s, tr1)
    s = com(s2, p2, tr1, jnp.zeros((1, 1), jnp.int32), jnp.asarray([1]))
    lg1.append(lg[0, 0]); tp1.append(tp[0, 0])
tp1 = np.stack([np.asarray(a, np.float32) for a in tp1])         # [8, L, D]
tp8 = np.asarray(tp8[0], np.float32)                              # [8, L, D]
per_layer = []
for l in range(len(taps)):
    a, b = tp1[:, l], tp8[:, l]
    per_layer.append({"layer": l, "type": "attention" if t.layers[l].is_full else "GDN",
                      "elements_differing": float(np.mean(a != b)),
                      "max_rel_diff": float(np.max(np.abs(a - b)) / np.max(np.abs(a)))})
lg1 = np.stack([np.asarray(a, np.float32) for a in lg1]); lg8 = np.asarray(lg8[0], np.float32)
out.update(dtype=sys.argv[1], per_layer=per_layer, logits_max_abs_diff=float(np.max(np.abs(lg1 - lg8))),
           argmax_equal=int(np.sum(lg1.argmax(-1) == lg8.argmax(-1))))
for r in per_layer:
    print(r)
print({k: v for k, v in out.items() if k != "per_layer"})
json.dump(out, open(sys.argv[2], "w"), indent=1)
