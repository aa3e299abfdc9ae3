"""Time the tree delta rule's implementations at the real GDN shape (48 value heads over 16 key heads,
Dk = Dv = 128).

    JAX_PLATFORMS=cuda python -m pallas_kernels.tree_delta_rule.bench [--sweep] [--impls pallas_triton] [--json out.json]

Each timed call is one jit applying the op `--layers` times in sequence (unrolled like the model's 48
GDN layers, each layer's state depending on the previous output so that nothing is hoisted), so
launch overhead is amortised as in a decode step; reported per layer, synchronised and on the device
(bench.profile.device_time, the kernels' summed durations). `--sweep` adds the kernel's
tuning variants (where the Gram tiles and M are formed, dot precision, value slice, key chunk, warps).
Each row also gives the bytes a layer's call reads and writes (its inputs, the state included, and its outputs) over its device time, against a
device copy measured in the same run (`frac_of_copy`): the op streams the fp32 state, so that is its ceiling.
The error (`rel_err_vs_reference`, o and delta of the last layer) is against the reference, run untimed.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp

from bench.cli import writable_file
from bench.harness import time_kernel, write_results
from pallas_kernels.tree_attention.bench import copy_bandwidth
from pallas_kernels.tree_delta_rule import arg_specs, pallas_triton, reference, xla
from pallas_kernels import dispatch


def implementations(sweep: bool, on_gpu: bool):
    impls = {"reference": reference.tree_delta_rule, "xla": xla.tree_delta_rule}
    if not on_gpu:
        return impls
    impls["pallas_triton"] = pallas_triton.tree_delta_rule
    if sweep:
        # where the Gram tiles are formed (default: inside prepare for one tile), and the opt-ins
        impls["pallas_triton/gram_outside"] = functools.partial(pallas_triton.tree_delta_rule, gram_inside=False)
        impls["pallas_triton/gram_inside"] = functools.partial(pallas_triton.tree_delta_rule, gram_inside=True)
        impls["pallas_triton/gram_ieee"] = functools.partial(pallas_triton.tree_delta_rule, gram_precision="ieee")
        for precision in sorted(pallas_triton.PRECISIONS):
            for block_dv in (32, 64, 128):
                for key_chunk, num_warps in ((32, 4), (16, 4), (32, 8)):
                    name = f"pallas_triton/{precision}/dv{block_dv}/kc{key_chunk}/w{num_warps}"
                    impls[name] = functools.partial(pallas_triton.tree_delta_rule, precision=precision,
                                                    block_dv=block_dv, key_chunk=key_chunk, num_warps=num_warps)
    return impls


def stacked(fn, layers):
    """`layers` calls in one jit, each layer's inputs depending on the previous layer's output. The keys and
    log-decays must depend too, not only the state: with the same k, g and beta in every layer XLA computes
    what does not touch the state (the Gram products, the prepare kernel) once for all layers, and the bench
    reported 27.4 us a layer at N = 64 where a DDTree round spent 58.5 (session 46)."""
    def run(q, k, v, g, beta, anc, s0):
        s, outs = s0, None
        for _ in range(layers):
            outs = fn(q, k, v, g, beta, anc, s)
            eps = 1e-6 * jnp.tanh(jnp.mean(outs[1]))     # the next layer depends on this one
            s, k, g = s + eps, k + eps.astype(k.dtype), g + eps.astype(g.dtype)
        return outs, s
    return jax.jit(run)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=",".join(map(str, arg_specs.VERIFY_SIZES + (arg_specs.CHUNK_SIZE,))))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=48)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--impls", default="", help="only these implementations (comma-separated; default: all there are)")
    p.add_argument("--json")
    a = dispatch.parse_args(p, argv)
    writable_file(p, "--json", a.json)         # before the timing, not after it
    on_gpu = jax.default_backend() == "gpu"
    impls = implementations(a.sweep, on_gpu)
    want = [x for x in a.impls.split(",") if x]
    if set(want) - set(impls):
        p.error(f"--impls: {sorted(set(want) - set(impls))} not available here; choose from {', '.join(impls)}")
    if want:
        impls = {k: v for k, v in impls.items() if k in want}
    copy_bw = copy_bandwidth(a.iters)
    rows = []
    print(f"{jax.devices()[0].device_kind}; batch {a.batch}, {arg_specs.REAL_HEADS} value heads over "
          f"{arg_specs.REAL_KEY_HEADS} key heads, "
          f"Dk = Dv = {arg_specs.REAL_DK}; per layer, median of {a.iters} calls of {a.layers} layers; "
          f"copy {copy_bw / 1e12:.2f} TB/s")
    for n in map(int, a.sizes.split(",")):
        spec = arg_specs.Spec(a.batch, n, arg_specs.REAL_HEADS, arg_specs.REAL_DK, arg_specs.REAL_DV, "tree",
                              key_heads=arg_specs.REAL_KEY_HEADS)
        args, _ = arg_specs.make_inputs(n, spec)
        # The error column is against the reference, run apart and untimed: not against whichever implementation
        # ran first (with --impls, a kernel was compared with itself).
        ref = jax.block_until_ready(stacked(reference.tree_delta_rule, a.layers)(*args))[0]
        for name, fn in impls.items():
            run = stacked(fn, a.layers)
            try:
                t = time_kernel(lambda: run(*args), a.iters)
            except Exception as e:  # a tuning variant that does not compile is a result, not a crash
                print(f"N={n:4d} {name:45s} failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                rows.append(dict(n=n, impl=name, error=str(e)[:500]))
                continue
            outs, compile_s = t["out"][0], t["compile_s"]
            us, dev_us = t["wall_s"] / a.layers * 1e6, t["device_s"] / a.layers * 1e6
            err = max(float(jnp.max(jnp.abs(x - r)) / jnp.max(jnp.abs(r))) for x, r in zip(outs[:2], ref[:2]))
            nbytes = sum(x.nbytes for x in jax.tree.leaves((args, outs)))
            bw = nbytes / ((dev_us if dev_us > 0 else us) * 1e-6)
            rows.append(dict(n=n, impl=name, us_per_layer=us, device_us_per_layer=dev_us, rel_err_vs_reference=err,
                             compile_s=compile_s, bytes_per_layer=nbytes, bytes_per_s=bw, frac_of_copy=bw / copy_bw))
            print(f"N={n:4d} {name:45s} {us:9.1f} us/layer (device {dev_us:7.1f})  {bw / 1e12:5.2f} TB/s "
                  f"({bw / copy_bw:5.1%} of copy)  err {err:.1e}  compile {compile_s:.1f} s", flush=True)
    if a.json:
        write_results(a.json, rows, batch=a.batch, layers=a.layers, copy_bytes_per_s=copy_bw)


if __name__ == "__main__":
    main()
