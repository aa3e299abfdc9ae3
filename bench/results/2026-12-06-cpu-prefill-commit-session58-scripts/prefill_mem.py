# Session 58: a one-piece chain prefill's temp memory (XLA's memory_analysis, compile only, no run), real widths:
# the forward then commit (before) against the forward committing inside the delta rule's scan (commit_n).
#   prefill_mem.py G DTYPE P...     layers (LINEAR x G, FULL); G = real: the real 48 GDN + 16 full layers
# (The figures in ../2026-12-06-cpu-prefill-commit-session58.txt came from this script's two earlier halves,
# prefill_mem2.py G P... in float32 and mem_full.py DTYPE P..., merged here without other change.)
import sys, jax, jax.numpy as jnp
from flax import nnx
from jaxspec import model as M
from jaxspec.config import qwen36_27b, FULL, LINEAR
from jaxspec.tree import chain
g, dtype = sys.argv[1], sys.argv[2]
cfg = qwen36_27b(dtype=dtype)
if g != "real":
    cfg = cfg.replace(layer_types=(LINEAR,) * int(g) + (FULL,))
graphdef, abstract = nnx.split(nnx.eval_shape(lambda: M.Qwen35(cfg, rngs=nnx.Rngs(0))))
for p in [int(x) for x in sys.argv[3:]]:
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
        print(f"{len(cfg.layer_types)} layers, {dtype}, {p} tokens, {name}: temp GB "
              f"{m.temp_size_in_bytes / 1e9:.3f}, args GB {m.argument_size_in_bytes / 1e9:.3f}", flush=True)
