"""#6 / the prefill (sessions 61-62; ~2 min on a GPU): the chain's state-pass kernel at the real shape (one layer of
an 8K prefill: 128 blocks of 64, 48 value heads, Dk = Dv = 128), per variant, and the whole chain_delta_rule op with
its defaults.
    python bench/next/k_chain_pass.py OUT.json [--small]       (--small: a CPU dry run, interpret mode)"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bench.harness import time_calls
from pallas_kernels.tree_delta_rule import pallas_triton
from pallas_kernels.tree_delta_rule.chain import chain_delta_rule


def timed(fn, *args, iters=5):
    """Median ms of `iters` synchronised calls after one untimed call (bench.harness.time_calls)."""
    return time_calls(lambda: jax.block_until_ready(fn(*args)), 1, iters)["median_ms"]


def main(out, small):
    b, nb, h, hk, c, dk, dv = (1, 3, 2, 1, 16, 16, 16) if small else (1, 128, 48, 16, 64, 128, 128)
    rng = np.random.default_rng(0)
    f = lambda *shape: jnp.asarray(0.1 * rng.standard_normal(shape), jnp.float32)
    args = (f(b, nb, h, c, dk), f(b, nb, h, c, dk), f(b, nb, h, dk, c), f(b, nb, h, c, dv), f(b, nb, h, c, c),
            jnp.asarray(rng.uniform(0.5, 1.0, (b, nb, h)), jnp.float32), f(b, h, dk, dv))
    # The default (tf32x3, 32 columns, one stage, 4 warps) first and last; session 62's calls 1 and 6 swept
    # precision, columns, key pieces, stages, warps and O inside or after the pass
    # (bench/results/2026-12-06-h100-s62/); session 63's call 1 found 16 columns on 2 warps 15% faster.
    variants = [dict(), dict(block_dv=16, num_warps=2), dict(block_dv=16, num_warps=4), dict(block_dv=16, num_warps=1),
                dict(block_dv=16, num_warps=2, key_chunk=16), dict()]
    rows = []
    for v in variants:
        try:
            ms = timed(jax.jit(lambda *a, v=v: pallas_triton.state_pass(*a, interpret=small, **v)), *args)
        except Exception as e:                      # a variant that does not compile is reported, not fatal
            ms = None
            print(v, "failed:", str(e).splitlines()[0][:200])
        rows.append(dict(v, ms=ms))
        print(f"state_pass {v}: {ms if ms is None else round(ms, 3)} ms", flush=True)
    n = nb * c
    q, k = (f(b, n, hk, dk) for _ in range(2))
    op = (q, k, f(b, n, h, dv), -jnp.abs(f(b, n, h)), jnp.abs(f(b, n, h)), f(b, h, dk, dv))
    impl = "pallas_interpret" if small else "pallas_triton"
    whole = timed(jax.jit(lambda *a: chain_delta_rule(*a, implementation=impl)), *op)
    print(f"chain_delta_rule, {n} tokens: {whole:.3f} ms", flush=True)
    json.dump(dict(device=jax.devices()[0].device_kind, shape=dict(b=b, blocks=nb, heads=h, key_heads=hk, chunk=c,
                                                                    dk=dk, dv=dv),
                   state_pass=rows, chain_delta_rule_ms=whole), open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], "--small" in sys.argv)
