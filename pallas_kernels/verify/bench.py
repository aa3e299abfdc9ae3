"""Time the per-node target choice at the real vocabulary (V = 248320) against the copy bandwidth.

    JAX_PLATFORMS=cuda python -m pallas_kernels.verify.bench [--json out.json]

Rows R = B * N tree nodes (1, 16, 65, 1025), fp32 logits (what Qwen35.logits returns). Reported per
call: device time (the kernels' summed durations; the synchronised call's wall time beside it) and the
logits bytes over that time as a fraction of a measured device copy (bench.harness.measure_copy); greedy
and temperature sampling, for the kernel, its jnp twin ("xla") and the jax.random reference.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp

from bench.cli import writable_file
from bench.harness import time_kernel, write_results
from pallas_kernels.tree_attention.bench import copy_bandwidth
from pallas_kernels.verify import api
from pallas_kernels import dispatch

VOCAB = 248320


def variant(key, logits, temperature, *, splits, interpret=False):
    """The kernel with `splits` programs per row (api.target_choice's pallas_triton path, splits forced)."""
    val, idx = api.choice_partial(key, logits, temperature, splits=splits,
                                  implementation="pallas_interpret" if interpret else "pallas_triton")
    return api.combine(val[:, None], idx[:, None])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,16,65,1025")
    p.add_argument("--vocab", type=int, default=VOCAB)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--impls", default="", help="only these implementations (comma-separated; default: all there are)")
    p.add_argument("--splits", default="", help="also time the kernel with these vocabulary splits per row "
                   "(comma-separated; rows 'pallas_triton/sN', each checked against the default's choices; GPU only)")
    p.add_argument("--json")
    a = dispatch.parse_args(p, argv)
    writable_file(p, "--json", a.json)         # before the timing, not after it
    on_gpu = jax.default_backend() == "gpu"
    copy_bw = copy_bandwidth(a.iters)
    print(f"{jax.devices()[0].device_kind}; copy {copy_bw / 1e12:.2f} TB/s; V = {a.vocab}, fp32 logits", flush=True)
    impls = ["reference", "xla"] + (["pallas_triton"] if on_gpu else [])
    want = [x for x in a.impls.split(",") if x]
    if set(want) - set(impls):
        p.error(f"--impls: {sorted(set(want) - set(impls))} not available here; choose from {', '.join(impls)}")
    impls = [i for i in impls if not want or i in want]
    splits = [int(x) for x in a.splits.split(",") if x]
    if splits and not on_gpu:
        p.error("--splits: the kernel's variants run on a GPU only")
    variants = {f"pallas_triton/s{n}": functools.partial(variant, splits=n) for n in splits}
    rows = []
    for r in map(int, a.rows.split(",")):
        x = jax.random.normal(jax.random.key(r), (r, a.vocab), jnp.float32)
        key = jax.random.key(0)
        for t in (0.0, 0.8):
            want_tokens = None
            for impl in impls + list(variants):
                fn = jax.jit(functools.partial(variants[impl], temperature=t) if impl in variants else
                             functools.partial(api.target_choice, temperature=t, implementation=impl))
                if impl in variants:    # a tuning variant must choose what the default kernel chooses
                    want_tokens = want_tokens if want_tokens is not None else api.target_choice(
                        key, x, t, implementation="pallas_triton")
                    if not bool(jnp.all(fn(key, x) == want_tokens)):
                        raise SystemExit(f"{impl}: chose other tokens than pallas_triton at R={r}, T={t}")
                # Device time: one call's host launch (~tens of us) is as long as the kernel itself here.
                tk = time_kernel(lambda: fn(key, x), a.iters)
                s = tk["device_s"] if tk["device_s"] > 0 else tk["wall_s"]
                bw = x.nbytes / s
                rows.append(dict(rows=r, temperature=t, impl=impl, us=s * 1e6, wall_us=tk["wall_s"] * 1e6,
                                 bytes_per_s=bw, frac_of_copy=bw / copy_bw))
                print(f"R={r:5d} T={t:.1f} {impl:14s} {s * 1e6:9.1f} us (one call {tk['wall_s'] * 1e6:9.1f})  "
                      f"{bw / 1e12:5.2f} TB/s ({bw / copy_bw:5.1%} of copy)", flush=True)
    if a.json:
        write_results(a.json, rows, copy_bytes_per_s=copy_bw)


if __name__ == "__main__":
    main()
