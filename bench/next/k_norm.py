"""What does each residual add + RMSNorm cost in front of the product it feeds, and can the scale move into it? (#6)

    PYTHONPATH=. python bench/next/k_norm.py --out F.json [--layers 16] [--calls 20]

Session 37's trace of the 27B AR step (bench/results/2026-12-04-h200-s37/fused/ar.json, 13.67 ms a round against the
13.5 ms goal) shows each of the step's 128 residual add + RMSNorm pairs as three kernels (the add, the sum of squares,
and the scale that writes the bf16 input of the next product; ~117 calls a step each, ~0.5 ms in all). This times,
at one row in bf16, `--layers` MLP blocks chained through the residual stream (x + down(silu(gate) * up) of the
norm of x, with the fused gate|up kernel), with the norm in three forms:
  - `model`: jaxspec's RMSNorm, normalised in fp32 and scaled by (1 + w) before the product (HF's order);
  - `scale_after`: the product of x * (1 + w), then each row times its 1 / rms (the same function, rounded
    elsewhere), which leaves XLA free to fuse the scale into the product's prologue and epilogue;
  - `none`: no norm at all (the product of x itself): the floor for any form.
Reported: microseconds a layer. Predicted (session 37): `model` ~4.5 us a layer above `none` (three ~1.5 us
kernels); `scale_after` 1.5-3 us below `model`. If it saves >= 2 us per norm (~0.26 ms over the step's 128), the
model should take that form, once it passes the transformers comparisons in fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.provenance import git_info

D, I, EPS = 5120, 17408, 1e-6   # the 27B hidden and MLP widths (`--small` for a CPU smoke run: 256, 512)


def norm_model(s, w):
    sf = s.astype(jnp.float32)
    sf = sf * jax.lax.rsqrt(jnp.mean(sf * sf, -1, keepdims=True) + EPS)
    return (sf * (1.0 + w.astype(jnp.float32))).astype(s.dtype)


def mlp(h, wgu, wd, r=None):
    y = h @ wgu
    if r is not None:
        y = (y.astype(jnp.float32) * r).astype(h.dtype)
    y = y.reshape(*y.shape[:-1], I, 2)
    return (jax.nn.silu(y[..., 0]) * y[..., 1]) @ wd


def make_step(form: str):
    def step(ws, x, u):
        for w in ws:
            s = x + u
            if form == "model":
                u = mlp(norm_model(s, w["norm"]), w["gate_up"], w["down"])
            elif form == "scale_after":
                sf = s.astype(jnp.float32)
                r = jax.lax.rsqrt(jnp.mean(sf * sf, -1, keepdims=True) + EPS)
                u = mlp((sf * (1.0 + w["norm"].astype(jnp.float32))).astype(s.dtype), w["gate_up"], w["down"], r)
            else:
                u = mlp(s, w["gate_up"], w["down"])
            x = s
            u = u * 1e-3
        return x, u
    return jax.jit(step)


def weights(layers, key):
    out = []
    for layer in range(layers):
        k1, k2, k3 = jax.random.split(jax.random.fold_in(key, layer), 3)
        mk = lambda kk, shape: (jax.random.normal(kk, shape, jnp.float32) * 0.02).astype(jnp.bfloat16)
        out.append({"gate_up": mk(k1, (D, 2 * I)), "down": mk(k2, (I, D)), "norm": mk(k3, (D,))})
    return out


def time_form(form, layers, calls, repeats=5):
    ws = weights(layers, jax.random.key(0))
    step = make_step(form)
    x, u = jnp.ones((1, D), jnp.bfloat16), jnp.zeros((1, D), jnp.bfloat16)
    for _ in range(3):
        x, u = step(ws, x, u)
    jax.block_until_ready((x, u))
    per = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            x, u = step(ws, x, u)
        jax.block_until_ready((x, u))
        per.append((time.perf_counter() - t) / calls)
    nbytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(ws))
    ms = float(np.median(per)) * 1e3
    return dict(form=form, us_per_layer=ms / layers * 1e3, tb_s=nbytes / (ms / 1e3) / 1e12)


def check_forms_agree():
    """`scale_after` is the model's function up to rounding: checked on random inputs in fp32 before timing (at
    full fp32 precision: the GPU's default runs fp32 products in bf16 passes, 1e-2 apart)."""
    with jax.default_matmul_precision("highest"):
        _check_forms_agree()


def _check_forms_agree():
    k = jax.random.split(jax.random.key(1), 4)
    s = jax.random.normal(k[0], (2, 64), jnp.float32)
    w = jax.random.normal(k[1], (64,), jnp.float32) * 0.1
    wgu = jax.random.normal(k[2], (64, 2 * 8), jnp.float32)
    a = norm_model(s, w) @ wgu
    r = jax.lax.rsqrt(jnp.mean(s * s, -1, keepdims=True) + EPS)
    b = ((s * (1.0 + w)) @ wgu) * r
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--calls", type=int, default=20, help="calls back to back per timing")
    ap.add_argument("--forms", default="model,scale_after,none")
    ap.add_argument("--small", action="store_true", help="widths 256 / 512: a quick check that it runs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.small:
        global D, I
        D, I = 256, 512
    check_forms_agree()
    res = dict(kind="norm_forms", git=git_info(), device=str(jax.devices()[0].device_kind),
               xla_flags=os.environ.get("XLA_FLAGS", ""), layers=args.layers, rows=[])
    for form in args.forms.split(","):
        r = time_form(form, args.layers, args.calls)
        res["rows"].append(r)
        print(f"{form:12s} {r['us_per_layer']:8.1f} us a layer  {r['tb_s']:.3f} TB/s", flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
