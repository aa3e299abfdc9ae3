import sys, jax, jax.numpy as jnp
from flax import nnx
from bench import harness as H
from jaxspec import model as M
from jaxspec.config import qwen36_27b, FULL, LINEAR
cfg = qwen36_27b(dtype="float32")
cfg = cfg.replace(layer_types=(LINEAR, LINEAR, LINEAR, FULL))
graphdef, abstract = nnx.split(nnx.eval_shape(lambda: M.Qwen35(cfg, rngs=nnx.Rngs(0))))
for p in [int(x) for x in sys.argv[1:]]:
    st = jax.eval_shape(lambda: M.init_state(cfg, 1, p + 128))
    toks = jax.ShapeDtypeStruct((1, p), jnp.int32)
    c = jax.jit(H.make_prefill(graphdef, cfg), donate_argnums=(1,)).lower(abstract, st, toks).compile()
    m = c.memory_analysis()
    print(p, "temp GB", m.temp_size_in_bytes / 1e9, "args GB", m.argument_size_in_bytes / 1e9,
          "out GB", m.output_size_in_bytes / 1e9, flush=True)
