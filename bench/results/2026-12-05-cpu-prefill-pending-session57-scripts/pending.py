import jax, jax.numpy as jnp
from flax import nnx
from jaxspec import model as M
from jaxspec.config import qwen36_27b, FULL, LINEAR
from jaxspec.tree import chain
cfg = qwen36_27b(dtype="bfloat16").replace(layer_types=(LINEAR, FULL))
model = nnx.eval_shape(lambda: M.Qwen35(cfg, rngs=nnx.Rngs(0)))
P = 1024
def f(model, st, toks):
    return model(toks, st, chain(1, P), logit_index=jnp.full((1,), P - 1, jnp.int32))
st = jax.eval_shape(lambda: M.init_state(cfg, 1, P + 128))
out = nnx.eval_shape(f, model, st, jax.ShapeDtypeStruct((1, P), jnp.int32))
pending = out[3]
for path, x in jax.tree_util.tree_leaves_with_path(pending):
    print(jax.tree_util.keystr(path), x.shape, x.dtype, f"{x.size * x.dtype.itemsize / P / 1e3:.1f} KB/token")
