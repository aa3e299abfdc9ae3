"""#6 / the prefill (session 63; ~1 min on a GPU): a prefill piece's prefix part. The chain attention op reads the
committed prefix with the tree attention kernel's prefix programs (~130 TFLOP/s on an 8K chain); could cuDNN read it
too, its padding mask bounding the keys at `start` inside the static cache? A piece of 256 nodes (24 q / 4 kv heads of
256, bf16) over a prefix of 8000 in caches of 8192 and 65536 slots: the prefix kernel against cuDNN (no causal mask,
kv_seqlen = start), each against the fp32 reference of attention over the prefix alone.
    python bench/next/k_prefix_cudnn.py OUT.json"""
import json
import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.tree_attention import pallas_triton


def timed(fn, *args, iters=10):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def kernel_prefix(q, keys, values, start):
    m, l, acc = pallas_triton.prefix_partials(q, keys, values, start)
    w = jnp.exp(m - jnp.max(m, -1, keepdims=True))
    return jnp.sum(w[..., None] * acc, -2) / jnp.sum(w * l, -1)[..., None]


def cudnn_prefix(q, keys, values, start):
    from jax._src.cudnn.fused_attention_stablehlo import MaskType, dot_product_attention
    n = jnp.full((q.shape[0],), q.shape[1], jnp.int32)
    return dot_product_attention(q, keys, values, q_seqlen=n, kv_seqlen=start.astype(jnp.int32),
                                 scale=1 / math.sqrt(q.shape[-1]), mask_type=MaskType.PADDING)


def reference(q, keys, values, start):
    s = int(start[0])
    qf, kf, vf = (x.astype(jnp.float32) for x in (q, keys[:, :s], values[:, :s]))
    b, n, h, hd = q.shape
    sc = jnp.einsum("bnkgd,blkd->bkgnl", qf.reshape(b, n, 4, h // 4, hd), kf, precision="highest") / math.sqrt(hd)
    o = jnp.einsum("bkgnl,blkd->bnkgd", jax.nn.softmax(sc, -1), vf, precision="highest")
    return o.reshape(b, n, h, hd)


def main(out):
    rng = np.random.default_rng(0)
    rows = []
    for length in (8192, 65536):
        q = jnp.asarray(rng.standard_normal((1, 256, 24, 256)), jnp.bfloat16)
        keys, values = (jnp.asarray(rng.standard_normal((1, length, 4, 256)), jnp.bfloat16) for _ in range(2))
        start = jnp.asarray([8000], jnp.int32)
        want = reference(q, keys, values, start)
        for name, fn in (("prefix_kernel", kernel_prefix), ("cudnn_padding", cudnn_prefix)):
            try:
                f = jax.jit(fn)
                got = f(q, keys, values, start).astype(jnp.float32)
                err = float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))
                row = dict(cache=length, name=name, ms=timed(f, q, keys, values, start), rel_err=err)
            except Exception as e:
                row = dict(cache=length, name=name, failed=(str(e).splitlines() or [type(e).__name__])[0][:300])
            rows.append(row)
            print(row, flush=True)
    json.dump(dict(device=jax.devices()[0].device_kind, nodes=256, prefix=8000, rows=rows), open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
