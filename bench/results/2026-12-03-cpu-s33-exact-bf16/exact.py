# A row-invariant ("exact") forward of the target, as a patch, to test whether bf16 speculation can be made
# token-identical to bf16 AR on this CPU. Each piece is fenced by jax.lax.optimization_barrier so that XLA cannot fuse
# an elementwise producer or consumer into a product (session 33's rowlocal.py: the fused pieces are what give a row
# other bits at 8 rows than alone; a bare product does not), and the GDN chain is solved one node at a time
# (jaxspec.model.CHUNK = 1), each node exactly as AR's one-token step, so a verify's node sees the bits AR's step would.
#   PYTHONPATH=. python bench/results/2026-12-03-cpu-s33-exact-bf16/exact.py eval [jaxspec.train eval flags]
#   PYTHONPATH=. python bench/results/2026-12-03-cpu-s33-exact-bf16/exact.py SCRIPT.py [its arguments]   (patched, then run)
# EXACT_PARTS (default "linear,logits,attention,chunk") picks the patches.
import math
import os
import runpy
import sys

import jax
import jax.numpy as jnp

import jaxspec.model as model
from pallas_kernels.tree_attention.reference import visible

fence = jax.lax.optimization_barrier
parts = set(os.environ.get("EXACT_PARTS", "linear,logits,attention,chunk").split(","))


TILE = int(os.environ.get("EXACT_TILE", "16"))


def tiled(x, w):
    """x [..., K] @ w [K, N] with the rows padded to whole tiles of TILE: every product XLA sees has TILE rows (the
    bare product was not row-invariant inside the model: 0.016% of in_proj_qkv's elements, gdnprobe.py)."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = math.prod(lead)
    pad = -rows % TILE
    xt = jnp.pad(x.reshape(rows, k), ((0, pad), (0, 0))).reshape(-1, TILE, k)
    y = jax.lax.map(lambda xi: fence(jnp.einsum("mk,kn->mn", fence(xi), w)), xt)
    return y.reshape(rows + pad, -1)[:rows].reshape(*lead, -1)


def linear(self, x):
    return tiled(x, self.kernel[...])


def logits(self, h):
    return model.mask_vocab(tiled(fence(self.norm(h)), self.unembedding()).astype(jnp.float32), self.cfg.vocab_size)


def attention(q, keys, values, start, anc):
    b, n, h, hd = q.shape
    kvh = keys.shape[2]
    qh = fence(q.reshape(b, n, kvh, h // kvh, hd))
    scores = fence(jnp.einsum("bnkgh,blkh->bkgnl", qh, keys, preferred_element_type=jnp.float32,
                              precision=jax.lax.Precision.HIGHEST))
    scores = scores / math.sqrt(hd)
    scores = jnp.where(visible(start, anc, keys.shape[1])[:, None, None], scores, -jnp.inf)
    probs = fence(jax.nn.softmax(scores, -1).astype(values.dtype))
    out = fence(jnp.einsum("bkgnl,blkh->bnkgh", probs, values, preferred_element_type=jnp.float32,
                           precision=jax.lax.Precision.HIGHEST))
    return out.reshape(b, n, h, hd).astype(values.dtype)


if "linear" in parts:
    model.Linear.__call__ = linear
if "logits" in parts:
    model.Qwen35.logits = logits
if "attention" in parts:
    model.tree_attention = attention
if "chunk" in parts:
    model.CHUNK = 1
print(f"exact parts: {sorted(parts)}", file=sys.stderr)

if sys.argv[1] == "eval":
    from jaxspec import train
    sys.exit(train.main(["eval"] + sys.argv[2:]))
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")
