"""Why does top-p alone cost a DDTree(63) round 1.6 ms more than greedy? (#6)

    PYTHONPATH=. python bench/next/k_nucleus.py --out F.json [--calls 20]

Session 55 (H100, bench/results/2026-12-05-h100-s55/sampled-rounds/): with top-p alone (0.7, 0, 0.9) the DDTree(63)
round is 28.43 ms against 26.83 greedy, DFlash 24.57 against 23.91; with top-k 20 (session 50, H200) the sampled
DDTree(63) round cost ~0.4 ms. `sampling.searched_nucleus_cut` runs 9 passes of 15 thresholds each; one pass sums
`where(key > t, e, 0)` over a [rows, 15, V] broadcast. If XLA emits that as 15 row reductions that each read the
row (key and e, 8 bytes a token), a pass reads ~15x the row, mostly from L2. This times, for the drafter's 15 rows
and the target's 64 (V = 248320, f32), the cut four ways, each checked against a sort-based cut:
  - `broadcast`: the shipped code (one [rows, 15, V] reduction a pass);
  - `unrolled`: the same search with 15 separate [rows, V] -> [rows] sums a pass (siblings XLA may fuse into one
    multi-output reduction that reads the row once);
  - `bucketed`: each token's bucket (how many thresholds its key passes) computed once, then 15 masked sums of e;
  - `pallas`: the same search with pallas_kernels/nucleus_mass's kernel for each pass (added in session 55, after
    the first run: one read of each row's keys and masses a pass), at its default tiles and two others;
  - `read`: one exp-and-sum over the row, the floor of one pass.
Predicted: on a GPU `broadcast` ~0.6-0.9 ms for 64 rows (9 passes of 15 L2-bound row reads), `unrolled` or
`bucketed` 2-5x shorter if XLA fuses the siblings (~9-10x `read`); if neither is shorter by >= 30%, the lead is
elsewhere (the log_softmax and Gumbel passes) and a Pallas pass is the next step.
Session 55's first run (H100, bench/results/2026-12-05-h100-s55/nucleus/): broadcast 0.37 / 1.23 ms at 15 / 64
rows, unrolled 0.44 / 1.46, bucketed 0.85 / 3.06: refuted. Predicted for `pallas` (written before its first GPU
run): 0.15-0.25 ms at 15 rows and 0.4-0.6 ms at 64 (9 passes of ~0.03-0.05 ms plus the loop's own small ops),
equal to the sorted cut; make it the GPU default if it is >= 30% shorter at 64 rows and its GPU tests pass.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import sampling
from jaxspec.sampling import search_passes
from pallas_kernels.nucleus_mass import api as nucleus_mass
from pallas_kernels.nucleus_mass.reference import ordered_key, unordered


def cut_with(sums, ways=16):
    """searched_nucleus_cut with its per-pass sums from `sums(key, e, t) -> [..., ways - 1]`."""
    def cut(x, top_p):
        key = ordered_key(x)
        e = jnp.exp(x - jnp.max(x, -1, keepdims=True))
        lo = jnp.zeros(x.shape[:-1] + (1,), jnp.uint32)
        hi = jnp.max(key, -1, keepdims=True)
        goal = top_p * jnp.sum(e, -1, keepdims=True)

        def narrow(_, bounds):
            lo, hi = bounds
            step = jnp.maximum((hi - lo) // ways, 1)
            t = jnp.minimum(lo + step * jnp.arange(1, ways, dtype=jnp.uint32), hi)
            below = jnp.concatenate([sums(key, e, t) < goal, jnp.ones_like(lo, bool)], -1)
            edges = jnp.concatenate([lo, t, hi], -1)
            m = jnp.argmax(below, -1)[..., None]
            return jnp.take_along_axis(edges, m, -1), jnp.take_along_axis(edges, m + 1, -1)

        return unordered(jax.lax.fori_loop(0, search_passes(ways), narrow, (lo, hi))[1])
    return cut


def unrolled(key, e, t):
    return jnp.stack([jnp.sum(jnp.where(key > t[..., j:j + 1], e, 0.0), -1) for j in range(t.shape[-1])], -1)


def bucketed(key, e, t):
    bucket = jnp.sum(key[..., None] > t[..., None, :], -1)                  # thresholds each key passes
    return jnp.stack([jnp.sum(jnp.where(bucket > j, e, 0.0), -1) for j in range(t.shape[-1])], -1)


def pallas(**tuning):
    impl = "pallas_triton" if jax.default_backend() == "gpu" else "pallas_interpret"
    return lambda key, e, t: nucleus_mass.mass_above(key, e, t, implementation=impl, **tuning)


def sorted_cut(x, top_p):
    srt = jnp.sort(x, -1)[..., ::-1]
    p = jax.nn.softmax(srt, -1)
    before = jnp.cumsum(p, -1) - p
    return jnp.min(jnp.where(before < top_p, srt, jnp.inf), -1, keepdims=True)


def timed(fn, x, calls):
    out = jax.block_until_ready(fn(x))
    t = time.perf_counter()
    for _ in range(calls):
        out = fn(x)
    jax.block_until_ready(out)
    return (time.perf_counter() - t) * 1e3 / calls, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--rows", default="15,64")
    ap.add_argument("--impls", default="broadcast,unrolled,bucketed,pallas,pallas-1024x8,pallas-2048x8")
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--ways", type=int, default=0, help="thresholds a pass + 1 (default: sampling.nucleus_ways())")
    ap.add_argument("--graphs", action="store_true",
                    help="compile with the engine's loop options (engine.LOOP_GRAPH_OPTIONS: the search's loop as a "
                         "CUDA graph, as inside a round; without them each pass returns to the host)")
    a = ap.parse_args(argv)
    ways = a.ways or sampling.nucleus_ways()
    ways_of = {"broadcast": lambda x, p: sampling.searched_nucleus_cut(x, p, ways),
               "unrolled": cut_with(unrolled, ways), "bucketed": cut_with(bucketed, ways),
               "pallas": cut_with(pallas(), ways),       # the kernel's defaults: tiles of 512, 4 warps
               "pallas-1024x8": cut_with(pallas(block_v=1024, num_warps=8), ways),
               "pallas-2048x8": cut_with(pallas(block_v=2048, num_warps=8), ways)}
    options = None
    if a.graphs:
        from jaxspec.engine import LOOP_GRAPH_OPTIONS
        options = LOOP_GRAPH_OPTIONS
    res = dict(backend=jax.default_backend(), device=str(jax.devices()[0]), ways=ways, vocab=a.vocab, rows={},
               graphs=a.graphs)
    for rows in map(int, a.rows.split(",")):
        # peaked rows, as a language model's: a scale of 4 puts most of the mass on a few hundred tokens
        x = 4.0 * jax.random.normal(jax.random.key(rows), (rows, a.vocab), jnp.float32)
        want = jax.jit(lambda x: sorted_cut(x, a.top_p))(x)
        r = res["rows"][rows] = {}
        r["read_ms"] = timed(jax.jit(lambda x: jnp.sum(jnp.exp(x - x.max(-1, keepdims=True)), -1)), x, a.calls)[0]
        for name in a.impls.split(","):
            cut = ways_of[name]
            fn = jax.jit(lambda x, cut=cut: cut(x, a.top_p), compiler_options=options)
            ms, got = timed(fn, x, a.calls)
            r[name] = dict(ms=ms, equal_to_sorted=bool(jnp.all(got == want)))
        print(rows, json.dumps(r), flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
