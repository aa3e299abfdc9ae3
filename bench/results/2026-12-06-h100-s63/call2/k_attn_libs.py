"""#6 / the prefill (session 63; ~2 min on a GPU): causal attention over an 8K chain at the real shape (24 q / 4 kv
heads of 256, bf16), one layer: the tree attention kernel (what the prefill runs: 100.9 ms for 16 layers on an H100
in session 63's call 1, ~131 TFLOP/s on the causal half) against two library kernels that do the same causal chain,
cuDNN's fused attention (jax.nn.dot_product_attention) and jax's own Mosaic GPU attention for Hopper
(jax.experimental.pallas.ops.gpu.attention_mgpu). Each against the fp32 reference (max abs error).
    python bench/next/k_attn_libs.py OUT.json [--small]       (--small: a CPU dry run, the reference only)"""
import json
import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.tree_attention import pallas_triton, reference


def timed(fn, *args, iters=10):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def variants(small):
    start = lambda q: jnp.zeros((q.shape[0],), jnp.int32)
    anc = lambda q: jnp.broadcast_to(jnp.tril(jnp.ones((q.shape[1],) * 2, bool)), (q.shape[0],) + (q.shape[1],) * 2)
    out = {"reference": lambda q, k, v: reference.tree_attention(q, k, v, start(q), anc(q))}
    if small:
        return out
    out["tree_attention"] = lambda q, k, v: pallas_triton.tree_attention(q, k, v, start(q), anc(q))
    out["cudnn"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    from jax.experimental.pallas.ops.gpu import attention_mgpu as mg
    for bq, bkv, steps in ((64, 64, 2), (64, 128, 2)):
        cfg = mg.TuningConfig(block_q=bq, block_kv=bkv, max_concurrent_steps=steps, causal=True)
        out[f"mgpu/{bq}x{bkv}x{steps}"] = lambda q, k, v, cfg=cfg: mg.attention(q, k, v, cfg)
    return out


def main(out, small):
    b, n, h, kvh, hd = (1, 256, 4, 2, 64) if small else (1, 8192, 24, 4, 256)
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((b, n, hh, hd)), jnp.bfloat16) for hh in (h, kvh, kvh))
    flops = 4 * b * h * hd * n * (n + 1) / 2                 # the causal half: QK^T and PV
    want = None
    rows = []
    for name, fn in variants(small).items():
        try:
            f = jax.jit(fn)
            got = f(q, k, v)
            if want is None:
                want = got.astype(jnp.float32)
            err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want)))
            ms = timed(f, q, k, v) if name != "reference" else None
            row = dict(name=name, ms=ms, max_abs_err=err,
                       tflop_s=None if ms is None else flops / ms / 1e9)
        except Exception as e:                      # a variant that does not compile is reported, not fatal
            row = dict(name=name, failed=str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
        rows.append(row)
        print(row, flush=True)
    json.dump(dict(device=jax.devices()[0].device_kind, shape=dict(b=b, n=n, heads=h, kv_heads=kvh, head_dim=hd),
                   causal_tflop=flops / 1e12, rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], "--small" in sys.argv)
