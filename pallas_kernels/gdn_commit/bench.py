"""Time the commit's GDN state update at the real shape: XLA's (the reference: one contraction, then a fusion a
layer) against the kernel's tilings, the states donated as in the engine's round loop.

    JAX_PLATFORMS=cuda python -m pallas_kernels.gdn_commit.bench [--paths 1,16,64] [--sweep] [--json out.json]

Per path length (1: an AR step; 16: a DFlash block or a DDTree(64) path; 64: a prefill block): the reference's and
the kernel's (at its defaults; `--sweep` adds other tilings and the fp32 dot) device time a call
(bench.profile.device_time: the kernels' summed durations, which is what the update adds to a round), its kernels,
the bytes a call must move (every layer's state read and written, the path's terms read) over that time, its
largest error against the reference relative to max |S1|, and its compile time. On a CPU (a check of the harness)
the kernel runs in interpret mode at a small shape.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from bench import profile
from bench.cli import at_least, writable_file
from bench.harness import parse_contexts, write_results
from pallas_kernels import dispatch
from pallas_kernels.gdn_commit import pallas_triton, reference
from pallas_kernels.gdn_commit.arg_specs import REAL, make_inputs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paths", default="1,16,64", help="path lengths (comma-separated)")
    p.add_argument("--sweep", action="store_true", help="also time the kernel's other tilings and the fp32 dot")
    p.add_argument("--iters", type=at_least(1), default=20, help="calls in the profiled trace")
    p.add_argument("--json", help="also write the rows to this JSON file")
    a = dispatch.parse_args(p, argv)
    paths = parse_contexts(p, "--paths", a.paths, "path lengths")
    writable_file(p, "--json", a.json)
    on_gpu = jax.default_backend() == "gpu"
    shape = REAL if on_gpu else dict(layers=4, b=1, h=4, hk=2, dk=32, dv=32)
    impls = {"reference": reference.gdn_commit,
             "pallas_triton": lambda *x: pallas_triton.gdn_commit(*x, interpret=not on_gpu)}
    for per, bdv, prec in ((1, 32, "tf32x3"), (4, 64, "tf32x3"), (4, 32, "ieee")) if a.sweep else ():
        impls[f"pallas_triton/per{per}/bdv{bdv}/{prec}"] = (
            lambda *x, per=per, bdv=bdv, prec=prec: pallas_triton.gdn_commit(
                *x, per=per, block_dv=bdv, precision=prec, interpret=not on_gpu))
    rows = []
    for n in paths:
        args = make_inputs(0, **(shape | dict(p=n)))
        moved = sum(x.nbytes for x in jax.tree.leaves((args, args[0])))       # the inputs, and S1 a layer
        want = None
        for name, fn in impls.items():
            got, timing = profile.donated_timing(fn, args, a.iters, moved)
            want = got if want is None else want
            err = max(float(np.abs(g - r).max()) for g, r in zip(got, want)) / max(float(np.abs(r).max())
                                                                                  for r in want)
            rows.append(dict(path=n, impl=name, **timing, rel_err_vs_reference=err, **shape))
            print(f"P={n:3d} {name:36s} {profile.timing_text(timing)}  err {err:.1e}  "
                  f"compile {timing['compile_s']:.1f} s", flush=True)
    if a.json:
        write_results(a.json, rows)
    return rows


if __name__ == "__main__":
    main()
