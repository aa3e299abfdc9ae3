"""lax.top_k against ddtree._chunked_top_k's chunks (what a GPU ranks under JAXSPEC_DDTREE_TOP_K=sort; traced here with
jax.default_backend patched to "gpu", since off a GPU the function now calls lax.top_k whole) at the real
vocabulary on this CPU."""
import time, jax, jax.numpy as jnp, numpy as np
from jaxspec import ddtree

backend = jax.default_backend


def chunked(x, k):
    jax.default_backend = lambda: "gpu"          # only while tracing: the compiled program is the CPU's
    try:
        return ddtree._chunked_top_k(x, k)
    finally:
        jax.default_backend = backend


V = 248320
for rows, k in ((1, 20), (16, 20), (64, 20), (15, 64), (15, 8)):
    x = jax.random.normal(jax.random.key(rows), (rows, V))
    for name, f in (("lax.top_k", lambda x: jax.lax.top_k(x, k)), ("chunked", lambda x: chunked(x, k))):
        g = jax.jit(f); r = g(x); jax.block_until_ready(r)
        np.testing.assert_array_equal(r[1], jax.lax.top_k(x, k)[1])
        ts = []
        for _ in range(7):
            t = time.perf_counter(); jax.block_until_ready(g(x)); ts.append(time.perf_counter() - t)
        print(rows, k, name, round(1e3 * float(np.median(ts)), 2), "ms", flush=True)
