"""The DDTree tree build alone: `build_tree` on random drafter log-probs of the real shape, per budget.

    python -m bench.tree_build [--budgets 63,64] [--vocab 248320] [--depth 15] [--out F.json]
                               [--kernels 12] [--hlo-dir DIR] [--variants plain,materialized]

Each budget is one jitted build timed back to back (bench.rounds.back_to_back: median wall ms per call and
the device time of one, with its kernel count), in seconds rather than the minutes bench.rounds needs to set
up the real model first. --kernels N adds each build's N longest kernels (from a trace, summed per kernel
name, per call); --hlo-dir writes each build's optimised HLO there, to name those kernels' fusions.

--variants: "plain" is the build as the engine runs it. "materialized" puts the counted top-k's input behind an
optimisation barrier, so that XLA cannot fuse the beam's candidate scores (a broadcast add reshaped from
[B, B] to B * B entries) into the O(C^2) comparison, where each comparison would recompute them with index
arithmetic that is a real division for B = 63 and a shift for B = 64 (the hypothesis for B = 63's 0.69 ms
against 0.47, bench/results/2026-12-01-h200-s14-table). Both variants must build the same tree; checked.
Session 16 refuted it (0.687 -> 0.663 ms, bench/results/2026-12-01-h200-s16-table): the kernels named the
cumsum of the counted selection instead, now ddtree.running_count.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench.cli import at_least, exit_with, writable_dir, writable_file, write_json
from bench.harness import git_info, machine_info, parse_contexts, versions
from bench.profile import load_events, trace
from bench.rounds import back_to_back
from jaxspec import ddtree
from jaxspec.sharding import claim_device_memory
from pallas_kernels import dispatch


VARIANTS = ("plain", "materialized")


@contextlib.contextmanager
def variant(name: str):
    """Within: jaxspec.ddtree.count_ranks as the variant has it (see the module docstring)."""
    keep = ddtree.count_ranks
    ddtree.build_tree.clear_cache()       # build_tree is jitted: a trace of the other variant must not be reused
    if name == "materialized":
        ddtree.count_ranks = lambda x: keep(jax.lax.optimization_barrier(x))
    try:
        yield
    finally:
        ddtree.count_ranks = keep
        ddtree.build_tree.clear_cache()


def top_kernels(call, n: int, steps: int = 5) -> list[dict]:
    """The n kernels (by name) that took longest per call, in a trace of `steps` calls."""
    jax.block_until_ready(call())
    with trace(call, steps) as xplane:
        events = load_events(xplane)[0] if xplane else []
    per: dict[str, list] = {}
    for _, dur, name, _ in events:
        k = per.setdefault(name, [0.0, 0])
        k[0] += dur
        k[1] += 1
    rows = [dict(kernel=name, us_per_call=d / 1e3 / steps, count_per_call=c / steps) for name, (d, c) in per.items()]
    return sorted(rows, key=lambda r: -r["us_per_call"])[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tree_build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="63,64", help="tree budgets (default: %(default)s)")
    ap.add_argument("--vocab", type=int, default=248320, help="vocabulary (default: %(default)s, Qwen3.6's)")
    ap.add_argument("--depth", type=int, default=15, help="drafted depths (default: %(default)s, block 16)")
    ap.add_argument("--k", type=at_least(1), default=20, help="calls per timed batch (default: %(default)s)")
    ap.add_argument("--out", help="write the results as JSON here (with the commit, machine and date)")
    ap.add_argument("--kernels", type=at_least(0), default=0,
                    help="list each build's N longest kernels (default: none)")
    ap.add_argument("--hlo-dir", help="write each build's optimised HLO here (tree_build_bB.hlo.txt)")
    ap.add_argument("--variants", default="plain", help="plain and/or materialized (default: %(default)s)")
    args = dispatch.parse_args(ap, argv)
    writable_file(ap, "--out", args.out)
    claim_device_memory()      # 90% of the GPU, as the other benches (JAX's default is 75%)
    if args.hlo_dir:    # a directory, made if missing (was: FileExistsError after the first budget's timing)
        writable_dir(ap, "--hlo-dir", args.hlo_dir, Path(args.hlo_dir))
    budgets = parse_contexts(ap, "--budgets", args.budgets, "tree budgets")   # or an error naming the flag
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS):
        raise SystemExit(f"--variants {args.variants!r}: expected some of {', '.join(VARIANTS)}")
    if args.vocab < 2 or args.depth < 1:
        raise SystemExit(f"--vocab {args.vocab} / --depth {args.depth}: need a vocabulary >= 2 and depth >= 1")

    logp = jax.nn.log_softmax(jax.random.normal(jax.random.key(0), (1, args.depth, args.vocab)) * 4, -1)
    root = jnp.ones((1,), jnp.int32)
    res = {"vocab": args.vocab, "depth": args.depth, "backend": jax.default_backend(),
           "device": jax.devices()[0].device_kind, "top_k": ddtree.top_k_method(64 * 64), "git": git_info(),
           "machine": machine_info(), "versions": versions(), "runs": {},
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    for b in budgets:
        trees = {}
        for v in variants:
            name = f"b{b}" + ("" if v == "plain" else f"_{v}")
            with variant(v):                       # build_tree is traced (and count_ranks looked up) here
                f = jax.jit(lambda lp, r, b=b: ddtree.build_tree(lp, r, b)).lower(logp, root).compile()
            trees[v] = jax.device_get(f(logp, root))
            t = back_to_back(f, (logp, root), args.k)
            res["runs"][name] = t
            print(f"tree_build B={b} {v}: {t['median_ms']:.3f} ms back to back, "
                  f"{t.get('device_ms', float('nan')):.3f} ms device, {t.get('kernels')} kernels", flush=True)
            if args.kernels > 0:
                t["top_kernels"] = top_kernels(lambda: f(logp, root), args.kernels)
                for k in t["top_kernels"]:
                    print(f"  {k['us_per_call']:8.1f} us  x{k['count_per_call']:g}  {k['kernel']}", flush=True)
            if args.hlo_dir:
                Path(args.hlo_dir).mkdir(parents=True, exist_ok=True)
                (Path(args.hlo_dir) / f"tree_build_{name}.hlo.txt").write_text(f.as_text())
        first = jax.tree.leaves(trees[variants[0]])
        for v, tr in trees.items():
            if not all(np.array_equal(x, y) for x, y in zip(first, jax.tree.leaves(tr))):
                print(f"tree_build B={b}: variant {v} built another tree than {variants[0]}", file=sys.stderr)
                return 1
    if args.out:
        write_json(args.out, res)
    return 0


if __name__ == "__main__":
    exit_with(main)
