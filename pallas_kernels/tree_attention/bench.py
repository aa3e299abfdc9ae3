"""Time tree attention at the real shape (24 q / 4 kv heads of 256, bf16) against the copy bandwidth.

    JAX_PLATFORMS=cuda python -m pallas_kernels.tree_attention.bench [--sweep] [--json out.json]

For each committed prefix (1K, 32K, 128K tokens) and tree size N (1, 16, 65): one jit applies the op to
`--layers` distinct caches in sequence (each layer's queries depend on the previous output, so nothing
is hoisted; distinct caches, so L2 does not serve a second read), cache length L = 2 * prefix + N
(the op must read only the first start + N slots). Reported per layer: time (synchronised calls, and on the
device: the kernels' summed durations in a trace, since session 45; at a 1K prefix the synchronised time is
mostly the host's), the KV bytes it must read (2 * (start + N) * KV * hd * 2 B) over the device time, and that
rate as a fraction of a measured device copy (read + write bytes / time of x + 1 over 1 GiB). `--sweep` adds the
kernel's tile and warp variants at every N >= 65; `--shape chain` times chains instead of random trees (a prefill
piece: `--prefixes 0 --sizes 8192`; the FLOPs still count every tree key, of which a chain's row blocks read about
half); `--splits 4,8,16` the kernel with those numbers of prefix splits at every size (the
default spreads even a 1K prefix over ~33 splits of 32 keys, whose fp32 partials the combine then reads).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp

from bench.cli import writable_file
from bench.harness import measure_copy, time_kernel, write_results
from pallas_kernels.tree_attention import arg_specs, pallas_triton, reference
from pallas_kernels import dispatch


def copy_bandwidth(iters):
    """Bytes/s of a device copy (read + write), as bench.harness measures it: the ceiling of every "of copy"
    row. Until session 16 this timed one 1 GiB `x + 1` per host call, which counted the launch and gave
    1.9-2.7 TB/s on the H200 where the harness got 3.7-3.9 in the same runs (so a kernel could show 158% of
    copy, bench/results/2026-12-01-h200-s16-table)."""
    gib = 4.0 if jax.default_backend() == "gpu" else 0.05   # as the harness; far beyond the 50 MB of L2
    return measure_copy(gib, iters)["tb_s"] * 1e12


def implementations(sweep: bool, on_gpu: bool, n: int, splits=()):
    impls = {"reference": reference.tree_attention}
    if not on_gpu:
        return impls
    impls["pallas_triton"] = pallas_triton.tree_attention
    for s in splits:
        impls[f"pallas_triton/s{s}"] = functools.partial(pallas_triton.tree_attention, splits=s)
    if sweep and n >= 65:
        for block_q in (16, 32, 64, 128):
            for block_k, num_warps in ((32, 4), (64, 4), (64, 8), (128, 8)):
                # The sweep runs at the real head_dim 256 in bf16; skip tiles that cannot fit.
                if pallas_triton.smem_bytes(block_q, block_k, 256, 2, 2) > pallas_triton.SMEM_LIMIT:
                    continue
                impls[f"pallas_triton/q{block_q}/k{block_k}/w{num_warps}"] = functools.partial(
                    pallas_triton.tree_attention, block_q=block_q, block_k=block_k, num_warps=num_warps)
    return impls


def stacked(fn, layers):
    def run(q, caches, start, anc):
        out = None
        for keys, values in caches:
            out = fn(q, keys, values, start, anc)
            q = q + (1e-3 * out).astype(q.dtype)       # the next layer depends on this one
        return out
    return jax.jit(run)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefixes", default=",".join(map(str, arg_specs.PREFIXES)))
    p.add_argument("--sizes", default=",".join(map(str, arg_specs.VERIFY_SIZES)))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--no-reference", action="store_true", help="skip the jnp reference (it reads all L slots)")
    p.add_argument("--sweep", action="store_true", help="the kernel's tile and warp variants at every N >= 65")
    p.add_argument("--shape", choices=("tree", "chain"), default="tree", help="random trees (verify) or chains "
                   "(a prefill piece)")
    p.add_argument("--splits", default="", help="comma-separated split counts to time beside the default "
                   "(default_splits), at every prefix and size: the kernel's partials and the jnp combine included")
    p.add_argument("--json")
    a = dispatch.parse_args(p, argv)
    writable_file(p, "--json", a.json)         # before the timing, not after it
    on_gpu = jax.default_backend() == "gpu"
    copy_bw = copy_bandwidth(a.iters)
    h, kv, hd = arg_specs.REAL_HEADS, arg_specs.REAL_KV_HEADS, arg_specs.REAL_HEAD_DIM
    print(f"{jax.devices()[0].device_kind}; copy {copy_bw / 1e12:.2f} TB/s; batch {a.batch}, {h}/{kv} heads of "
          f"{hd}, bf16; per layer, median of {a.iters} calls of {a.layers} layers", flush=True)
    rows = []
    for prefix in map(int, a.prefixes.split(",")):
        for n in map(int, a.sizes.split(",")):
            spec = arg_specs.Spec(a.batch, n, prefix, shape=a.shape, ragged=False, slack=prefix, dtype="bfloat16")
            caches, q = [], None
            for layer in range(a.layers):
                q_l, keys, values, start, anc = arg_specs.make_inputs(1000 * prefix + 10 * n + layer, spec)
                q = q_l if q is None else q
                caches.append((keys, values))
            kv_bytes = 2 * a.batch * (prefix + n) * kv * hd * 2
            # the two products (scores, weighted values) over every key the kernel reads, masked ones included
            flops = 4 * a.batch * n * h * (prefix + n) * hd
            ints = lambda text: [int(x) for x in text.split(",") if x]
            for name, fn in implementations(a.sweep, on_gpu, n, ints(a.splits)).items():
                if name == "reference" and a.no_reference:
                    continue
                run = stacked(fn, a.layers)
                try:
                    t = time_kernel(lambda: run(q, caches, start, anc), a.iters)
                except Exception as e:  # a variant that does not compile is a result, not a crash
                    print(f"prefix {prefix:6d} N={n:4d} {name:32s} failed: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:100]}", flush=True)
                    rows.append(dict(prefix=prefix, n=n, impl=name, error=str(e)[:500]))
                    continue
                wall, dev = t["wall_s"] / a.layers, t["device_s"] / a.layers
                bw = kv_bytes / dev
                rows.append(dict(prefix=prefix, n=n, impl=name, us_per_layer=wall * 1e6,
                                 device_us_per_layer=dev * 1e6, kv_bytes=kv_bytes, bytes_per_s=bw,
                                 frac_of_copy=bw / copy_bw, flops=flops, flop_s=flops / dev,
                                 compile_s=t["compile_s"],
                                 finite=bool(jnp.isfinite(t["out"].astype(jnp.float32)).all())))
                print(f"prefix {prefix:6d} N={n:4d} {name:32s} {wall * 1e6:9.1f} us/layer (device {dev * 1e6:7.1f})"
                      f"  {bw / 1e12:5.2f} TB/s on the device ({bw / copy_bw:5.1%} of copy)  "
                      f"compile {t['compile_s']:.1f} s", flush=True)
            del caches
    if a.json:
        write_results(a.json, rows, batch=a.batch, layers=a.layers, shape=a.shape, copy_bytes_per_s=copy_bw)


if __name__ == "__main__":
    main()
