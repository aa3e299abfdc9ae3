"""Can a residual add + RMSNorm after a skinny product be one kernel, if the product's K splits come to it? (#6)

    JAX_PLATFORMS=cuda PYTHONPATH=. python bench/next/k_split_norm.py --out F.json [--hlo DIR] [--sizes 16,64,1]
    CPU check that it runs: PYTHONPATH=. python bench/next/k_split_norm.py --small --out F.json

Why (session 79, from session 44's optimized HLO of verify(16), bench/results/2026-12-04-h200-s44/inputs-params):
at 16 rows XLA splits each product that feeds a residual add (MLP down, GDN out, attention o) into 8 K slices,
f32[8, 16, 5120], and sums them in the add's fusion (`loop_add_fusion`, 2.1 us, 122 a step on session 78's
H100); the norm after it is a second kernel (`input_convert_reduce_fusion`, 1.9 us, 128 a step): 0.49 ms of
verify(16)'s kernels. A Pallas add + norm that takes x + u cannot remove the first: XLA must sum the slices before
the call (session 78's kernel run: 127 such sums a step, 0.242 ms). So the fused form must take the slices.

This times `--layers` pairs (out product [K, D] -> residual add + norm -> next product [D, K] times the row scale,
its output the next pair's input), at the real widths (D 5120, K 6144), in these forms:
  - `xla`: the model today (the product in bf16, pallas_kernels/add_rms_norm's reference, the deferred row scale);
  - `split_rows`: the product's K split by hand (`--splits` batched slices, f32), summed in the add, then the
    same full-row sum of squares;
  - `split_chunks`: the same, with the sum of squares per chunk of 512 columns (q [R, D / 512]) and the row
    scale from q's sum where it is used (in the next product's consumer, if XLA fuses it there);
  - `xla_chunks`: XLA's product, the chunked sum of squares;
  - `split_pallas`: the slices into pallas_kernels/add_rms_norm's kernel (a program per row and 512 columns);
  - `none`: no norm (s = x + u feeds the next product): the floor.
Reported per form and row count: kernels' device time and kernels a pair (bench.profile.device_time), and the
largest relative error of the last pair's outputs against `xla` (and against `split_rows`, the same
rounding as `split_pallas`); with --hlo, each compiled program's text and
its fusions by kind. Predicted (session 79): `xla` 2 kernels a pair beside the products; `split_pallas` 1 kernel
of 1.5-2.5 us, the products as fast as XLA's own split, so 1.5-2.5 us a pair less than `xla` at 16 rows; the jnp
split forms as `xla` or worse (XLA keeps a reduction of the slices apart from the row reduction).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys

import jax
import jax.numpy as jnp

from bench import profile
from jaxspec.model import k_slices
from jaxspec.provenance import git_info
from pallas_kernels.add_rms_norm import pallas_triton, reference

D, K, CHUNK, EPS, OFFSET = 5120, 6144, 512, 1e-6, 1.0     # --small: 256, 384, 128
FORMS = ("xla", "split_rows", "split_chunks", "xla_chunks", "split_pallas", "none")
f32, bf16 = jnp.float32, jnp.bfloat16


def scale_of(q, d):
    return jax.lax.rsqrt(jnp.sum(q, -1, keepdims=True) / d + EPS)


def pair(form, splits, interpret, x, a, wo, wi, w):
    """One pair: u = a @ wo, then the add + norm in `form`, then the next product. Returns (x + u, next a)."""
    d = x.shape[-1]
    if form in ("xla", "xla_chunks", "none"):
        u = a @ wo
        if form == "none":
            s = x + u
            return s, s @ wi
        s = x + u
        if form == "xla":
            s, h, r = reference.add_rms_norm(x, u, w, eps=EPS, offset=OFFSET)
    else:
        p = k_slices(a, wo, splits)
        if form == "split_pallas":
            s, h, r = pallas_triton.add_rms_norm(x, p, w, eps=EPS, offset=OFFSET, interpret=interpret)
        elif form == "split_rows":
            s, h, r = reference.add_rms_norm(x, p, w, eps=EPS, offset=OFFSET)
        else:
            s = reference.add(x, p)
    if form in ("split_chunks", "xla_chunks"):       # the reference's s and h, the sum of squares by chunks
        sf = s.astype(f32)
        h = (sf * (OFFSET + w.astype(f32))).astype(x.dtype)
        r = scale_of(jnp.sum((sf * sf).reshape(sf.shape[0], -1, CHUNK), -1), d)
    return s, ((h @ wi).astype(f32) * r).astype(x.dtype)


def make_run(form, splits, interpret):
    def run(ws, x, a):
        outs = []
        for wo, wi, w in ws:
            x, a = pair(form, splits, interpret, x, a, wo, wi, w)
            outs.append((x, a))                # every pair's outputs returned: nothing is dropped
        return outs
    return jax.jit(run)


def weights(layers, key):
    mk = lambda kk, shape, std: (jax.random.normal(kk, shape, f32) * std).astype(bf16)
    out = []
    for layer in range(layers):
        k1, k2, k3 = jax.random.split(jax.random.fold_in(key, layer), 3)
        out.append((mk(k1, (K, D), K ** -0.5), mk(k2, (D, K), D ** -0.5), mk(k3, (D,), 0.1)))
    return out


def rel_err(outs, refs) -> float:
    return max(float(jnp.max(jnp.abs(o - r)) / jnp.max(jnp.abs(r))) for o, r in zip(outs, refs))


def fusions(hlo: str) -> dict:
    """The compiled program's ENTRY instructions by kind: fusions by their kind, custom calls, the rest."""
    entry = hlo[hlo.index("\nENTRY"):]
    kinds = re.findall(r"kind=(k\w+)", entry) + ["custom-call"] * entry.count(" custom-call(")
    return {k: kinds.count(k) for k in sorted(set(kinds))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--sizes", default="16,64,1", help="rows a block (comma-separated)")
    ap.add_argument("--layers", type=int, default=16, help="pairs per timed call")
    ap.add_argument("--splits", type=int, default=8, help="K slices of the hand-split product")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--steps", type=int, default=5, help="traced calls per device time")
    ap.add_argument("--small", action="store_true", help="widths 256 / 384, chunks of 128: a check that it runs")
    ap.add_argument("--hlo", help="write each compiled program's text (gzip) here")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    forms = args.forms.split(",")
    bad = [f for f in forms if f not in FORMS]
    if bad:
        ap.error(f"--forms: unknown {bad}; choose from {','.join(FORMS)}")
    if args.small:
        global D, K, CHUNK
        D, K, CHUNK = 256, 384, 128
    if args.splits < 1 or K % args.splits:
        ap.error(f"--splits {args.splits} must be a positive divisor of K = {K}")
    interpret = jax.default_backend() != "gpu"
    if args.hlo:
        os.makedirs(args.hlo, exist_ok=True)
    ws = weights(args.layers, jax.random.key(0))
    res = dict(kind="split_norm", git=git_info(), device=str(jax.devices()[0].device_kind), layers=args.layers,
               splits=args.splits, widths=dict(D=D, K=K, chunk=CHUNK), rows=[])
    for n in [int(s) for s in args.sizes.split(",")]:
        kx, ka = jax.random.split(jax.random.key(n))
        x, a = jax.random.normal(kx, (n, D), f32).astype(bf16), jax.random.normal(ka, (n, K), f32).astype(bf16)
        ref = split = None
        for form in forms:
            run = make_run(form, args.splits, interpret)
            out = jax.block_until_ready(run(ws, x, a))
            last = [o.astype(f32) for o in out[-1]]
            ref = last if ref is None else ref
            err = rel_err(last, ref)
            split = last if form == "split_rows" else split
            t = profile.device_time(lambda: run(ws, x, a), args.steps)
            hlo = run.lower(ws, x, a).compile().as_text()
            row = dict(rows=n, form=form, device_us_per_pair=t.get("device_ms", float("nan")) * 1e3 / args.layers,
                       kernels_per_pair=t.get("kernels", float("nan")) / args.layers, rel_err_vs_xla=err,
                       rel_err_vs_split_rows=rel_err(last, split) if split else None, fusions=fusions(hlo))
            if args.hlo:
                with gzip.open(os.path.join(args.hlo, f"{form}-{n}.hlo.txt.gz"), "wt") as f:
                    f.write(hlo)
            res["rows"].append(row)
            print(f"rows {n:3d} {form:13s} {row['device_us_per_pair']:8.2f} us a pair  "
                  f"{row['kernels_per_pair']:5.2f} kernels  err {err:.1e} "
                  f"(split_rows: {row['rel_err_vs_split_rows']})  {row['fusions']}", flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
