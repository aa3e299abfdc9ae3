"""Time the fused GDN decode step at the real shape against the jnp reference (what XLA makes of the same
math), over the 48 GDN layers of one decode step.

    JAX_PLATFORMS=cuda python -m pallas_kernels.gdn_decode.bench [--batch 1] [--json out.json]

One jit applies the op to --layers distinct inputs in sequence (each layer's conv input depends on the
previous output, so nothing is hoisted; distinct states, so L2 does not serve a second read) and returns every
layer's outputs (so nothing is dropped). Reported:
time per layer, synchronised (host launches included) and on the device (bench.profile.device_time: the
kernels' summed durations; in the 64-layer model the kernel took 6.5 us a layer where this loop's wall time
said 26), and the bytes a layer must move (its [Hv, Dk, Dv] fp32 state read once, the conv window and
weights, the outputs) over that time, and the kernel's largest relative error against the reference
(last layer's outputs, bf16 inputs).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

from bench.cli import writable_file
from bench.harness import time_kernel, write_results
from pallas_kernels.gdn_decode import arg_specs, pallas_triton, reference
from pallas_kernels import dispatch


def stacked(fn, layers):
    """One jit applying fn to each layer's arguments in turn, returning every layer's outputs: were only the last
    layer's returned, XLA would drop the earlier layers' work the next layer does not read (their new states)."""
    def run(stack):
        outs = []
        for args in stack:
            if outs:                                 # the next layer depends on this one
                o = outs[-1][0]
                args = (args[0] + (1e-3 * o.reshape(args[0].shape[0], -1)[:, :1]).astype(args[0].dtype),) + args[1:]
            outs.append(fn(*args))
        return outs
    return jax.jit(run)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=arg_specs.REAL_GDN_LAYERS)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json")
    a = dispatch.parse_args(p, argv)
    writable_file(p, "--json", a.json)         # before the timing, not after it
    on_gpu = jax.default_backend() == "gpu"
    stack = [arg_specs.make_inputs(i, a.batch, **arg_specs.REAL, dtype=jnp.bfloat16) for i in range(a.layers)]
    moved = sum(int(x.size) * x.dtype.itemsize for x in stack[0]) + 4 * a.batch * 48 * 128 * 3
    impls = {"reference": lambda *x: reference.gdn_decode(*x, eps=1e-6)}
    if on_gpu:       # the kernel at its default (4 warps), and on 8
        impls["pallas_triton"] = lambda *x: pallas_triton.gdn_decode(*x, eps=1e-6)
        impls["pallas_triton/w8"] = lambda *x: pallas_triton.gdn_decode(*x, eps=1e-6, num_warps=8)
    rows, ref = [], None
    for name, fn in impls.items():
        run = stacked(fn, a.layers)
        t = time_kernel(lambda: run(stack), a.iters)
        outs, compile_s = t["out"][-1], t["compile_s"]
        ref = outs if ref is None else ref
        err = max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - r.astype(jnp.float32))) /
                        jnp.max(jnp.abs(r.astype(jnp.float32)))) for x, r in zip(outs, ref))
        per, dev = t["wall_s"] / a.layers, t["device_s"] / a.layers
        rate = moved / dev if dev > 0 else float("nan")          # no kernel in the trace: no rate
        rows.append(dict(impl=name, us_per_layer=per * 1e6, device_us_per_layer=dev * 1e6,
                         ms_per_step=per * 1e3 * arg_specs.REAL_GDN_LAYERS, bytes_per_layer=moved,
                         bytes_per_s=moved / per, device_bytes_per_s=rate, rel_err_vs_reference=err,
                         compile_s=compile_s))
        print(f"{name:20s} {per * 1e6:8.1f} us/layer (device {dev * 1e6:6.1f})  "
              f"{per * 1e3 * arg_specs.REAL_GDN_LAYERS:6.3f} ms per 48 layers  {rate / 1e12:5.2f} TB/s on the device  "
              f"err {err:.1e}  compile {compile_s:.1f} s", flush=True)
    if a.json:
        write_results(a.json, rows, batch=a.batch, layers=a.layers)


if __name__ == "__main__":
    main()
