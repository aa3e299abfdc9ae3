# Which of the demo target's row-local pieces give a row different bits at 8 rows than alone (bf16, this CPU)?
# Each piece is jitted as the model runs it; inputs are the embeddings of 8 tokens of jaxspec/train.py (the same
# tokens as rowinv.py's chain) pushed through layer 0's input norm, so they have the model's scale.
#   PYTHONPATH=. python bench/results/2026-12-03-cpu-s33-exact-bf16/rowlocal.py OUT.json
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from convert.hf import load_target
from jaxspec.model import add_norm
from jaxspec.tokenizer import load_tokenizer

t = load_target("jaxspec/demo/target", dtype="bfloat16")
ids = load_tokenizer("jaxspec/demo/target").encode(open("jaxspec/train.py").read())[64:72]
l0 = t.layers[0]
la, cfg = l0.linear_attn, t.cfg
rng = np.random.default_rng(0)
x = t.embed(jnp.asarray([ids]))                                           # [1, 8, D]
u = jnp.asarray(rng.standard_normal(x.shape) * float(jnp.std(x.astype(jnp.float32))), x.dtype)
o = jnp.asarray(rng.standard_normal((1, 8, cfg.linear_num_value_heads, cfg.linear_value_head_dim)), jnp.float32)
pieces = {
    "input_layernorm": lambda x, u, o: l0.input_layernorm(x),
    "norm + in_proj_qkv": lambda x, u, o: la.in_proj_qkv(l0.input_layernorm(x)),
    "norm + in_proj_z": lambda x, u, o: la.in_proj_z(l0.input_layernorm(x)),
    "in_proj_qkv on a bf16 input": lambda x, u, o: la.in_proj_qkv(x),
    "gated norm + out_proj": lambda x, u, o: la.out_proj(
        (la.norm(o.astype(x.dtype)) * jax.nn.silu(la.in_proj_z(x).reshape(o.shape).astype(jnp.float32)))
        .astype(x.dtype).reshape(1, -1, cfg.value_dim)),
    "add_norm (residual + post norm)": lambda x, u, o: add_norm(x, u, l0.post_attention_layernorm)[1],
    "mlp": lambda x, u, o: l0.mlp(x),
    "mlp gate_proj": lambda x, u, o: l0.mlp.gate_proj(x),
    "mlp silu(gate) * up": lambda x, u, o: jax.nn.silu(l0.mlp.gate_proj(x)) * l0.mlp.up_proj(x),
    "add_norm + mlp": lambda x, u, o: l0.mlp(add_norm(x, u, l0.post_attention_layernorm)[1]),
    "lm_head (logits)": lambda x, u, o: t.logits(x),
}
out = {}
for name, fn in pieces.items():
    f = jax.jit(fn)
    full = np.asarray(f(x, u, o)[0], np.float32)
    alone = np.concatenate([np.asarray(f(x[:, i:i + 1], u[:, i:i + 1], o[:, i:i + 1])[0], np.float32)
                            for i in range(8)])
    out[name] = {"elements_differing": float(np.mean(full != alone)),
                 "rows_bitwise_equal": int(np.sum(np.all(full.reshape(8, -1) == alone.reshape(8, -1), 1)))}
    print(f"{name:34s} elements differing {out[name]['elements_differing']:.5f}, "
          f"rows bitwise equal {out[name]['rows_bitwise_equal']} / 8")
json.dump(out, open(sys.argv[1], "w"), indent=1)
