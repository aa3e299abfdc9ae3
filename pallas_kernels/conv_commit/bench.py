"""Time the commit's conv-history update at the real shape: XLA's (the reference: a gather a layer, and a copy of
each donated history) against the kernel's tilings, the histories donated as in the engine's round loop.

    JAX_PLATFORMS=cuda python -m pallas_kernels.conv_commit.bench [--sweep] [--json out.json]

The reference's and the kernel's (at its defaults; `--sweep` adds other tilings) device time a call
(bench.profile.device_time: the kernels' summed durations, what the update adds to a round), its kernels, the bytes
a call must move (each history's K-1 new rows read, from the history or the block, and written) over that time,
whether it equals the reference, and its compile time. On a CPU (a check of the harness) the kernel runs in
interpret mode at a small shape.
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
    p.add_argument("--sweep", action="store_true", help="also time the kernel's other tilings")
    p.add_argument("--iters", type=at_least(1), default=20, help="calls in the profiled trace")
    p.add_argument("--json", help="also write the rows to this JSON file")
    a = dispatch.parse_args(p, argv)
    writable_file(p, "--json", a.json)
    on_gpu = jax.default_backend() == "gpu"
    shape = REAL if on_gpu else dict(layers=4, b=1, km1=3, n=4, c=64)
    impls = {"reference": reference.conv_commit,
             "pallas_triton": lambda *x: pallas_triton.conv_commit(*x, interpret=not on_gpu)}
    for per, bc in ((4, 1024), (1, 256), (4, 2048)) if a.sweep else ():
        impls[f"pallas_triton/per{per}/bc{bc}"] = (
            lambda *x, per=per, bc=bc: pallas_triton.conv_commit(*x, per=per, block_c=bc, interpret=not on_gpu))
    args = make_inputs(0, **shape)
    moved = 2 * sum(h.nbytes for h in args[0]) + args[2].nbytes + args[3].nbytes     # rows read + written, win, keep
    rows, want = [], None
    for name, fn in impls.items():
        got, timing = profile.donated_timing(fn, args, a.iters, moved)
        want = got if want is None else want
        same = all(np.array_equal(g, r) for g, r in zip(got, want))
        rows.append(dict(impl=name, **timing, equal_to_reference=same, **shape))
        print(f"{name:30s} {profile.timing_text(timing)}  equal {same}  compile {timing['compile_s']:.1f} s",
              flush=True)
    if a.json:
        write_results(a.json, rows)
    return rows


if __name__ == "__main__":
    main()
