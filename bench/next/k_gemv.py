"""Would one wider product per layer stream the 27B's weights faster than its separate ones? (#6)

    PYTHONPATH=. python bench/next/k_gemv.py --out F.json [--layers 16] [--calls 20]

The 27B AR step is 14.38 ms a round (the engine's AR loop, calls queued; roofline 11.9 ms). Session 22's trace
(bench/results/2026-12-01-h200-s22-loop-graphs-v65/while_graph.json, `ar_trace`) puts 12.26 ms of its 14.67 ms of
kernels in products streaming ~4.18 TB/s, where the lm_head's one product streams ~4.5. This times, for the real
shapes at one row in bf16, `--layers` layers' products chained as in a decode step, each family two ways:
  - `sep`: the checkpoint's weights, one product each (MLP gate / up; attention q / k / v; GDN qkv / z / b / a);
  - `merged`: one product of their weights side by side ([5120, 34816], [5120, 14336], [5120, 16480]).
The MLP's down product follows in both (its input is the gate x up). Reported: ms a layer and TB/s of weight bytes.
`out_proj` (session 37) times the [6144, 5120] output product stored [in, out] (the model's) and [out, in].
Run it once as is and once with XLA_FLAGS=--xla_gpu_enable_triton_gemm=false (cuBLAS for every product).
Predicted (session 36): `sep` MLP ~4.17 TB/s (as in the model); `merged` MLP 4.25-4.40; attention `sep` below 3.7
(k / v are 10 MB products), `merged` 4.0-4.3. A gain under ~2% of the step (0.3 ms) is not worth a new weight layout.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.provenance import git_info

D, I = 5120, 17408
FAMILIES = {  # family: (separate products' widths, whether the MLP's down product follows)
    "mlp": ((I, I), True),
    "attn": ((24 * 256 * 2, 4 * 256, 4 * 256), False),
    "gdn": ((2 * 16 * 128 + 48 * 128, 48 * 128, 48, 48), False),
}


def make_step(widths, down: bool, merged: bool):
    """One decode step's products for this family over every layer, chained through x [1, D]."""
    def step(ws, x):
        for w in ws:
            if merged:
                outs = jnp.split(x @ w["in"], np.cumsum(widths)[:-1].tolist(), axis=-1)
            else:
                outs = [x @ wi for wi in w["in"]]
            if down:
                h = jax.nn.silu(outs[0]) * outs[1]
                x = x + (h @ w["down"]) * 1e-3
            else:
                x = x + sum(o[:, :1].astype(jnp.float32).sum() for o in outs).astype(x.dtype) * 1e-3
        return x
    return jax.jit(step)


def weights(widths, down, merged, layers, key):
    out = []
    for layer in range(layers):
        k = jax.random.fold_in(key, layer)
        ks = jax.random.split(k, len(widths) + 1)
        mk = lambda kk, shape: (jax.random.normal(kk, shape, jnp.float32) * 0.02).astype(jnp.bfloat16)
        w = {"in": mk(ks[0], (D, sum(widths))) if merged else [mk(kk, (D, n)) for kk, n in zip(ks, widths)]}
        if down:
            w["down"] = mk(ks[-1], (I, D))
        out.append(w)
    return out


def median_ms(step, ws, x, calls, repeats=5):
    """Median ms of one call of step(ws, x) -> x, over `repeats` runs of `calls` calls back to back."""
    for _ in range(3):
        x = step(ws, x)
    jax.block_until_ready(x)
    per = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            x = step(ws, x)
        jax.block_until_ready(x)
        per.append((time.perf_counter() - t) / calls)
    return float(np.median(per)) * 1e3


def row(family, form, ms, layers, nbytes):
    return dict(family=family, form=form, ms_per_layer=ms / layers, tb_s=nbytes / (ms / 1e3) / 1e12,
                weight_gb=nbytes / 1e9)


def time_family(name, merged, layers, calls):
    widths, down = FAMILIES[name]
    ws = weights(widths, down, merged, layers, jax.random.key(0))
    jax.block_until_ready(ws)
    ms = median_ms(make_step(widths, down, merged), ws, jnp.ones((1, D), jnp.bfloat16), calls)
    nbytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(ws))
    return row(name, "merged" if merged else "sep", ms, layers, nbytes)


def time_out_proj(transposed: bool, layers: int, calls: int, k=6144, n=D):
    """o_proj / GDN out_proj ([6144, 5120]; session 37: 3.57 TB/s in the model against 4.32 for the down product)
    with the weight stored [in, out] (x @ w, the model's) or [out, in] (x @ w.T, the checkpoint's)."""
    key = jax.random.key(1)
    shape = (n, k) if transposed else (k, n)
    ws = [(jax.random.normal(jax.random.fold_in(key, i), shape, jnp.float32) * 0.02).astype(jnp.bfloat16)
          for i in range(layers)]

    @jax.jit
    def step(ws, x):
        for w in ws:
            y = x @ (w.T if transposed else w)
            x = x + y[:, :1].astype(jnp.float32).sum().astype(x.dtype) * 1e-3
        return x

    ms = median_ms(step, ws, jnp.ones((1, k), jnp.bfloat16), calls)
    return row("out_proj", "out_in" if transposed else "in_out", ms, layers, layers * k * n * 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--calls", type=int, default=20, help="calls back to back per timing")
    ap.add_argument("--families", default="mlp,attn,gdn,out_proj",
                    help="comma-separated: mlp, attn, gdn (separate vs side by side), out_proj (two weight layouts)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    res = dict(kind="gemv_forms", git=git_info(), device=str(jax.devices()[0].device_kind),
               xla_flags=os.environ.get("XLA_FLAGS", ""), rows=[])
    runs = [functools.partial(time_family, name, merged) for name in args.families.split(",") if name in FAMILIES
            for merged in (False, True)]
    if "out_proj" in args.families.split(","):
        runs += [functools.partial(time_out_proj, t) for t in (False, True)]
    for run in runs:
        r = run(args.layers, args.calls)
        res["rows"].append(r)
        print(f"{r['family']:8s} {r['form']:6s} {r['ms_per_layer'] * 1e3:8.1f} us a layer  {r['tb_s']:.3f} TB/s",
              flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
