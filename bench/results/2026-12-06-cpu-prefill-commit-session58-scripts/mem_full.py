# The real 27B layer pattern (48 GDN + 16 full), real widths, bfloat16 config, one-piece prefill of P tokens:
# XLA's memory_analysis on this CPU (compile only): forward then commit against commit_n.
import sys, jax, jax.numpy as jnp
from flax import nnx
from jaxspec import model as M
from jaxspec.config import qwen36_27b
from jaxspec.tree import chain
cfg = qwen36_27b(dtype=sys.argv[1])
graphdef, abstract = nnx.split(nnx.eval_shape(lambda: M.Qwen35(cfg, rngs=nnx.Rngs(0))))
for p in [int(x) for x in sys.argv[2:]]:
    st = jax.eval_shape(lambda: M.init_state(cfg, 1, p + 128))
    toks = jax.ShapeDtypeStruct((1, p), jnp.int32)
    tr, n = chain(1, p), jnp.full((1,), p, jnp.int32)
    def before(params, st, toks):
        lg, _, new, pend = nnx.merge(graphdef, params)(toks, st, tr, logit_index=n - 1)
        return lg, M.commit(cfg, new, pend, tr, jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (1, p)), n)
    def as_it_goes(params, st, toks):
        lg, _, new, _ = nnx.merge(graphdef, params)(toks, st, tr, logit_index=n - 1, commit_n=n)
        return lg, new
    for name, f in (("forward then commit", before), ("commit_n", as_it_goes)):
        m = jax.jit(f, donate_argnums=(1,)).lower(abstract, st, toks).compile().memory_analysis()
        print(f"{len(cfg.layer_types)} layers, {sys.argv[1]}, {p} tokens, {name}: temp GB "
              f"{m.temp_size_in_bytes / 1e9:.3f}, args GB {m.argument_size_in_bytes / 1e9:.3f}", flush=True)
