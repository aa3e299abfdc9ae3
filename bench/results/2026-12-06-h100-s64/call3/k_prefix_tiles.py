"""#6 / the prefill in pieces (session 63's plan, item 2; ~2 min on a GPU): a prefill piece's prefix part, the tree
attention kernel's prefix programs (`prefix_partials`), per tile / warp / split variant, for a piece of 256 nodes (24 q
/ 4 kv heads of 256, bf16) over prefixes of 512 to 8000 keys, beside cuDNN's causal attention of the piece itself.
The default tiles (64 x 32 on 4 warps) were chosen for verify's trees; a piece's 1536 rows make 24 row blocks a kv
head, and the default split count (2) then gives 192 programs for 132 SMs. Each variant's merged output against the
default's (max relative error). Session 64's call 2 ran the first variant list (64 x 64, 128 x 32 and 128 x 64 tiles,
splits 4-16; bench/results/2026-12-06-h100-s64/call2/): 128 x 64 on 8 warps halved the default at 8000 keys but took
0.561 ms at 2000 (default 0.231); this list times the 128 x 64 tile per split count at four prefixes, and the first
two variants again at the end of each prefix, so an outlier shows as one.
    python bench/next/k_prefix_tiles.py OUT.json [--small]      (--small: a CPU dry run, interpreted, tiny heads)"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from bench.harness import time_calls
from pallas_kernels.chain_attention import cudnn, reference
from pallas_kernels.tree_attention import pallas_triton


def timed(fn, *args, iters=10):
    """Median ms of `iters` synchronised calls after one untimed call (bench.harness.time_calls)."""
    return time_calls(lambda: jax.block_until_ready(fn(*args)), 1, iters)["median_ms"]


BIG = dict(block_q=128, block_k=64, num_warps=8)
VARIANTS = [dict(), BIG] + [dict(BIG, splits=s) for s in (2, 4, 8, 12, 16)] + [dict(), BIG]


def main(out, small):
    n, h, kvh, hd = (32, 4, 2, 16) if small else (256, 24, 4, 256)
    prefixes = (40,) if small else (512, 2000, 4000, 8000)
    rng = np.random.default_rng(0)
    rows = []
    for prefix in prefixes:
        length = prefix + n
        q = jnp.asarray(rng.standard_normal((1, n, h, hd)), jnp.bfloat16)
        keys, values = (jnp.asarray(rng.standard_normal((1, length, kvh, hd)), jnp.bfloat16) for _ in range(2))
        start = jnp.asarray([prefix], jnp.int32)
        k, v = keys[:, prefix:], values[:, prefix:]
        self_part = reference.self_attention if small else cudnn.self_attention
        o, lse = jax.jit(self_part)(q, k, v)
        if not small:
            rows.append(dict(prefix=prefix, name="cudnn_self", ms=timed(jax.jit(self_part), q, k, v)))
            print(rows[-1], flush=True)
        want = None
        for var in VARIANTS:
            fn = jax.jit(lambda q, keys, values, start, var=var: pallas_triton.prefix_partials(
                q, keys, values, start, interpret=small, **var))
            try:
                got = reference.merge(*fn(q, keys, values, start), o, lse)
                want = got if want is None else want
                err = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
                row = dict(prefix=prefix, **var, ms=timed(fn, q, keys, values, start, iters=2 if small else 10),
                           rel_err_vs_default=err)
            except Exception as e:                      # a variant that does not compile is reported, not fatal
                row = dict(prefix=prefix, **var, failed=(str(e).splitlines() or [type(e).__name__])[0][:300])
            rows.append(row)
            print(row, flush=True)
    json.dump(dict(device=jax.devices()[0].device_kind, nodes=n, heads=h, kv_heads=kvh, head_dim=hd, rows=rows),
              open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], "--small" in sys.argv)
