"""Time the GDN output gate at the real shape, the kernel against the jnp reference, over the 48 GDN layers of one
verify.

    JAX_PLATFORMS=cuda python -m pallas_kernels.gdn_gated_norm.bench [--sizes 16,64,65] [--json out.json]

One jit applies the op to --layers distinct inputs in sequence (each layer's o depends on the previous layer's
output, so nothing is hoisted). XLA may fuse the reference across the stacked layers, so its time here is a lower
bound of what it costs inside the model; bench.verify_profile is the comparison that counts. Per block size: time
per layer, synchronised and on the device (bench.profile.device_time), the bytes a layer reads and writes over
that time, and the largest relative error against the reference (bf16 y).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from bench.harness import time_kernel, write_results
from pallas_kernels.gdn_gated_norm import arg_specs, pallas_triton, reference


def stacked(fn, layers):
    def run(stack):
        out = None
        for o, y, w in stack:
            if out is not None:                      # the next layer depends on this one
                o = o + 1e-3 * out[:, :, :1, None].astype(o.dtype)
            out = fn(o, y, w)
        return out
    return jax.jit(run)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="16,64,65", help="nodes per block (comma-separated)")
    p.add_argument("--layers", type=int, default=arg_specs.REAL_GDN_LAYERS)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json")
    a = p.parse_args(argv)
    dims = dict(dk=arg_specs.REAL["dk"], eps=arg_specs.EPS)
    impls = {"reference": lambda *x: reference.gdn_gated_norm(*x, **dims)}
    if jax.default_backend() == "gpu":
        impls["pallas_triton"] = lambda *x: pallas_triton.gdn_gated_norm(*x, **dims)
    rows = []
    for n in (int(s) for s in a.sizes.split(",") if s):
        stack = [arg_specs.make_inputs(i, 1, n, **arg_specs.REAL, dtype=jnp.bfloat16) for i in range(a.layers)]
        ref = None
        for name, fn in impls.items():
            step = stacked(fn, a.layers)             # one jit per (size, impl): timing it must not retrace
            t = time_kernel(lambda: step(stack), a.iters)
            out = t["out"].astype(jnp.float32)
            ref = out if ref is None else ref
            err = float(jnp.max(jnp.abs(out - ref)) / jnp.max(jnp.abs(ref)))
            moved = sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves((stack[0], t["out"])))
            per, dev = t["wall_s"] / a.layers, t["device_s"] / a.layers
            rows.append(dict(n=n, impl=name, us_per_layer=per * 1e6, device_us_per_layer=dev * 1e6,
                             bytes_per_layer=moved, device_bytes_per_s=moved / dev, rel_err_vs_reference=err,
                             compile_s=t["compile_s"]))
            print(f"N={n:4d} {name:14s} {per * 1e6:8.1f} us/layer (device {dev * 1e6:6.1f})  "
                  f"{moved / dev / 1e12:5.2f} TB/s on the device  err {err:.1e}  compile {t['compile_s']:.1f} s",
                  flush=True)
    if a.json:
        write_results(a.json, rows, layers=a.layers)


if __name__ == "__main__":
    main()
