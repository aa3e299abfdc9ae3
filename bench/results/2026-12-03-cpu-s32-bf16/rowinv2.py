import jax, jax.numpy as jnp, numpy as np
from convert.hf import load_target
from jaxspec.tokenizer import load_tokenizer
t = load_target("jaxspec/demo/target", dtype="bfloat16")
ids = load_tokenizer("jaxspec/demo/target").encode(open("jaxspec/train.py").read())[64:72]
la = t.layers[0].linear_attn
names = [n for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a") if hasattr(la, n)]
@jax.jit
def proj(tokens):
    h = t.layers[0].input_layernorm(t.embed(tokens))
    return [getattr(la, n)(h) for n in names]
full = proj(jnp.asarray([ids]))
alone = [proj(jnp.asarray([[i]])) for i in ids]
for j, n in enumerate(names):
    a = np.concatenate([np.asarray(x[j][0], np.float32) for x in alone]); b = np.asarray(full[j][0], np.float32)
    print(n, "elements differing (8 rows at once vs one at a time):", float(np.mean(a != b)))
