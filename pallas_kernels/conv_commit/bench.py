"""Time the commit's conv-history update at the real shape: XLA's (the reference: a gather a layer, and a copy of
each donated history) against the kernel's tilings, the histories donated as in the engine's round loop.

    JAX_PLATFORMS=cuda python -m pallas_kernels.conv_commit.bench [--json out.json]

Each variant's device time a call (bench.profile.device_time: the kernels' summed durations, what the update adds
to a round), its kernels, whether it equals the reference, and its compile time. On a CPU (a check of the harness)
the kernel runs in interpret mode at a small shape.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from bench import profile
from bench.cli import at_least, writable_file
from bench.harness import write_results
from pallas_kernels import dispatch
from pallas_kernels.conv_commit import pallas_triton, reference
from pallas_kernels.conv_commit.arg_specs import REAL, make_inputs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=at_least(1), default=20, help="calls in the profiled trace")
    p.add_argument("--json", help="also write the rows to this JSON file")
    a = dispatch.parse_args(p, argv)
    writable_file(p, "--json", a.json)
    on_gpu = jax.default_backend() == "gpu"
    shape = REAL if on_gpu else dict(layers=4, b=1, km1=3, n=4, c=64)
    impls = {"reference": reference.conv_commit}
    for per, bc in ((1, 1024), (4, 1024), (1, 256), (4, 2048)):
        impls[f"pallas_triton/per{per}/bc{bc}"] = (
            lambda *x, per=per, bc=bc: pallas_triton.conv_commit(*x, per=per, block_c=bc, interpret=not on_gpu))
    args = make_inputs(0, **shape)
    rows, want = [], None
    for name, fn in impls.items():
        got, compile_s, dev = profile.time_donated(fn, args, a.iters)
        want = got if want is None else want
        same = all(np.array_equal(g, r) for g, r in zip(got, want))
        row = dict(impl=name, device_us=dev.get("device_ms", float("nan")) * 1e3, kernels=dev.get("kernels"),
                   equal_to_reference=same, compile_s=compile_s, **shape)
        rows.append(row)
        print(f"{name:30s} {row['device_us']:8.1f} us  {row['kernels']} kernels  equal {same}  "
              f"compile {compile_s:.1f} s", flush=True)
    if a.json:
        write_results(a.json, rows)
    return rows


if __name__ == "__main__":
    main()
