"""Time the GDN tree inputs at the real shape, the kernel against the jnp reference (what XLA makes of the same
math), over the 48 GDN layers of one verify.

    JAX_PLATFORMS=cuda python -m pallas_kernels.gdn_tree_inputs.bench [--sizes 16,64,65] [--json out.json]

One jit applies the op to --layers distinct inputs in sequence (each layer's in_proj product depends on the
previous layer's output, so nothing is hoisted). Per block size (a DFlash chain of 16, random trees of 64 and
65): time per layer, synchronised and on the device (bench.profile.device_time, the kernels' summed
durations), the bytes a layer reads and writes over that time, and the largest relative error against the
reference (last layer's outputs, bf16 inputs).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from bench.harness import time_kernel, write_results
from pallas_kernels.gdn_tree_inputs import arg_specs, pallas_triton, reference


def stacked(fn, layers):
    def run(stack):
        out = None
        for args in stack:
            if out is not None:                      # the next layer depends on this one
                args = (args[0] + (1e-3 * out[2][:, :, 0, :1]).astype(args[0].dtype),) + args[1:]
            out = fn(*args)
        return out
    return jax.jit(run)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="16,64,65", help="nodes per block (comma-separated)")
    p.add_argument("--layers", type=int, default=arg_specs.REAL_GDN_LAYERS)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json")
    a = p.parse_args(argv)
    dims = dict(dk=arg_specs.REAL["dk"], dv=arg_specs.REAL["dv"])
    impls = {"reference": lambda *x: reference.gdn_tree_inputs(*x, **dims)}
    if jax.default_backend() == "gpu":
        impls["pallas_triton"] = lambda *x: pallas_triton.gdn_tree_inputs(*x, **dims)
    rows = []
    for n in (int(s) for s in a.sizes.split(",") if s):
        parent = arg_specs.random_parents(n, 1, n, chain=n == 16)
        stack = [arg_specs.make_inputs(i, parent, **arg_specs.REAL, dtype=jnp.bfloat16) for i in range(a.layers)]
        ref = None
        for name, fn in impls.items():
            step = stacked(fn, a.layers)             # one jit per (size, impl): timing it must not retrace
            t = time_kernel(lambda: step(stack), a.iters)
            outs = t["out"]
            ref = outs if ref is None else ref
            err = max(float(jnp.max(jnp.abs(x - r)) / jnp.max(jnp.abs(r))) for x, r in zip(outs, ref))
            moved = sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves((stack[0], outs)))
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
