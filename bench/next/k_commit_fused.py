"""#6, build + accept + commit (0.79 ms a round against the goal's 0.5, H200, session 60): is the commit's GDN
state update faster as ONE Pallas kernel over all 48 layers than as XLA makes it today? A measurement, not an op:
the kernel here is a prototype, built into pallas_kernels (reference, dispatch, per-shard wrapper, tests) only if
it wins on the GPU.

Today (`jaxspec.model.commit` -> `states_at`): one batched product writes every layer's update U = K^T W Delta
(48 x 3.1 MB), then 48 fusions read U and S0 back and write S1 = where(keep, e^G S0 + U, S0): ~600 MB moved, 49
kernels; on an H100 about 0.35 ms of accept + commit's 0.39 (bench/results/2026-12-07-h100-s74/). The kernel: a
program per (sequence, value head, slice of Dv, group of layers) reads S0's tile, the path's k and w * Delta, and
writes S1 over S0 (input_output_aliases, the states donated): ~300 MB, one kernel. Sessions 44-45's kernel a
layer (`state_update`, removed) was 10-90x slower than XLA, blamed on Triton's fp32 dot, so the inner product
comes in four forms: "ieee" and "tf32x3" dots ([Dk, P] x [P, bdv], k pre-transposed by XLA), "fma" (P rank-1
updates, statically unrolled, rows loaded from the refs) and "fma_loop" (the same in a loop). On an H100 (session
75) "fma" with a layer a program took 207.6 against XLA's 343.4 us (chain of 16), but 314 s to compile.

    JAX_PLATFORMS=cuda PYTHONPATH=. python bench/next/k_commit_fused.py --out DIR      (the real shape, a sweep)
    JAX_PLATFORMS=cpu PYTHONPATH=. python bench/next/k_commit_fused.py --tiny --out DIR  (interpret mode, a check)

Per case (a chain of 16 as DFlash's; a path of 16 in a tree of 65 as DDTree(64)'s): each variant's device time
per call (bench.profile.device_time, the kernels' summed durations), its kernels, and its largest error against
XLA's S1, relative to max |S1|. Written to DIR/commit_fused.json, one line per row to stdout as it goes.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from bench import profile
from pallas_kernels.tree_delta_rule.reference import states_at

PRECISIONS = {"ieee": lax.Precision.HIGHEST, "tf32x3": lax.DotAlgorithmPreset.TF32_TF32_F32_X3}


def _kernel(*refs, layers, per, form, precision, n_pad):
    s0_refs, (k_ref, wd_ref, eg_ref), out_refs = refs[:layers], refs[layers:layers + 3], refs[layers + 3:]
    g = pl.program_id(3)
    eg_all = eg_ref[...]                                             # [Lp] this head's e^G (1 where not kept)
    lane = lax.broadcasted_iota(jnp.int32, eg_all.shape, 0)
    for l in range(layers):
        gi, j = divmod(l, per)

        @pl.when(g == gi)
        def _(l=l, j=j):
            e = jnp.sum(jnp.where(lane == l, eg_all, 0.0))
            if form == "fma":                                        # k_ref [per, P, Dk], wd_ref [per, P, bdv]
                u = k_ref[j, 0][:, None] * wd_ref[j, 0][None, :]
                for p in range(1, n_pad):
                    u = u + k_ref[j, p][:, None] * wd_ref[j, p][None, :]
            elif form == "fma_loop":                                 # the same, a loop (16x less code to compile)
                u = lax.fori_loop(0, n_pad, lambda p, acc: acc + k_ref[j, p][:, None] * wd_ref[j, p][None, :],
                                  jnp.zeros(out_refs[l].shape, jnp.float32))
            else:                                                    # k_ref [per, Dk, P]
                u = lax.dot_general(k_ref[j], wd_ref[j], (((1,), (0,)), ((), ())), precision=precision,
                                    preferred_element_type=jnp.float32)
            out_refs[l][...] = e * s0_refs[l][...] + u


def fused_update(s0s, k, wd, eg, *, form, per, block_dv, num_warps=4, interpret=False):
    """s0s: L x [B, H, Dk, Dv] fp32 (overwritten: donate them); k: [L, B, Hk, P, Dk] ("fma") or [L, B, Hk, Dk, P];
    wd: [L, B, H, P, Dv] (w * Delta, 0 where not kept); eg: [B, H, Lp] (e^G, 1 where not kept; Lp a power of
    two >= L). Returns L x S1 = eg * S0 + K^T WD, each in its S0's buffer."""
    layers = len(s0s)
    b, h, dk, dv = s0s[0].shape
    hk = k.shape[2]
    rep, n_pad = h // hk, wd.shape[3]
    bdv = min(block_dv, dv)
    groups = layers // per
    assert groups * per == layers and per & (per - 1) == 0, (layers, per)
    tile = pl.BlockSpec((None, None, dk, bdv), lambda bi, hi, vi, gi: (bi, hi, 0, vi))
    kblk = (per, None, None, n_pad, dk) if form.startswith("fma") else (per, None, None, dk, n_pad)
    in_specs = [tile] * layers + [
        pl.BlockSpec(kblk, lambda bi, hi, vi, gi: (gi, bi, hi // rep, 0, 0)),
        pl.BlockSpec((per, None, None, n_pad, bdv), lambda bi, hi, vi, gi: (gi, bi, hi, 0, vi)),
        pl.BlockSpec((None, None, eg.shape[2]), lambda bi, hi, vi, gi: (bi, hi, 0))]
    return pl.pallas_call(
        functools.partial(_kernel, layers=layers, per=per, form=form, n_pad=n_pad,
                          precision=lax.Precision.HIGHEST if interpret else PRECISIONS.get(form)),
        out_shape=tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in s0s),
        grid=(b, h, dv // bdv, groups),
        in_specs=in_specs,
        out_specs=tuple([tile] * layers),
        input_output_aliases={i: i for i in range(layers)},
        compiler_params=pltriton.CompilerParams(num_warps=num_warps),
        interpret=interpret,
        name="commit_fused",
    )(*s0s, k, wd, eg)


def terms(ks, deltas, Gs, anc_row, G_nodes, keep, nodes, *, form):
    """What the kernel reads, formed by XLA from the model's pending terms (as `states_at` forms them)."""
    G, G_node = jnp.stack(Gs), jnp.stack(G_nodes)                                 # [L,B,N,H], [L,B,H]
    k, delta = jnp.stack(ks), jnp.stack(deltas)
    if nodes is not None:
        take = lambda x: jnp.take_along_axis(x, nodes.reshape((1,) + nodes.shape + (1,) * (x.ndim - 3)), 2)
        G, k, delta = take(G), take(k), take(delta)
    a = (anc_row[:, :, None] & keep[:, None, None])[None, ..., None]             # [1,B,P,1,1]
    w = jnp.where(a[..., 0], jnp.exp(jnp.where(a[..., 0], G_node[:, :, None] - G, 0.0)), 0.0)   # [L,B,P,H]
    wd = jnp.moveaxis(w[..., None] * delta, 2, 3)                                  # [L,B,H,P,Dv]
    k = jnp.moveaxis(k.astype(jnp.float32), 2, 3)                                  # [L,B,Hk,P,Dk]
    p = k.shape[3]
    n_pad = p if form.startswith("fma") else max(16, pl.next_power_of_2(p))
    if n_pad > p:
        k = jnp.pad(k, [(0, 0)] * 3 + [(0, n_pad - p), (0, 0)])
        wd = jnp.pad(wd, [(0, 0)] * 3 + [(0, n_pad - p), (0, 0)])
    if not form.startswith("fma"):
        k = jnp.swapaxes(k, 3, 4)                                                  # [L,B,Hk,Dk,P]
    eg = jnp.moveaxis(jnp.where(keep[None, :, None], jnp.exp(G_node), 1.0), 0, 2)  # [B,H,L]
    lp = pl.next_power_of_2(eg.shape[2])
    return k, wd, jnp.pad(eg, [(0, 0), (0, 0), (0, lp - eg.shape[2])], constant_values=1.0)


def xla_update(s0s, ks, deltas, Gs, anc_row, G_nodes, keep, nodes, *, rep):
    """What jaxspec.model.commit runs today for the GDN states."""
    s1s = states_at(s0s, ks, deltas, Gs, anc_row, G_nodes, rep=rep, nodes=nodes)
    return tuple(jnp.where(keep[:, None, None, None], s1, s0) for s1, s0 in zip(s1s, s0s))


def case(seed, *, layers, b, h, hk, dk, dv, n, path):
    """Random pending terms of a verified block of n nodes and its accepted path (path nodes: all n in a chain)."""
    rng = np.random.default_rng(seed)
    f32 = np.float32
    s0s = [rng.standard_normal((b, h, dk, dv), f32) * 0.3 for _ in range(layers)]
    ks = [rng.standard_normal((b, n, hk, dk), f32) for _ in range(layers)]
    ks = [k / np.linalg.norm(k, axis=-1, keepdims=True) for k in ks]
    deltas = [rng.standard_normal((b, n, h, dv), f32) * 0.1 for _ in range(layers)]
    Gs = [np.cumsum(-rng.uniform(0.0, 0.3, (b, n, h)).astype(f32), axis=1) for _ in range(layers)]
    last = rng.integers(n // 2, n, b)
    if path == n:        # a chain: the last accepted node's ancestors are the nodes up to it
        nodes, anc_row = None, np.arange(n)[None] <= last[:, None]
    else:                # a tree: the accepted path's nodes, in depth order, the first `count` of them valid
        nodes = np.sort(np.stack([rng.choice(np.arange(1, n), path, replace=False) for _ in range(b)]), 1)
        nodes[:, 0] = 0
        count = rng.integers(path // 2, path + 1, b)
        anc_row = np.arange(path)[None] < count[:, None]
        last = nodes[np.arange(b), count - 1]
    G_nodes = [G[np.arange(b), last] for G in Gs]
    keep = np.ones(b, bool)
    keep[-1] = b == 1      # with several sequences, the last is finished: its states must stay as they were
    j = lambda xs: [jnp.asarray(x) for x in xs]
    return (j(s0s), j(ks), j(deltas), j(Gs), jnp.asarray(anc_row), j(G_nodes), jnp.asarray(keep),
            None if nodes is None else jnp.asarray(nodes, jnp.int32))


def threaded(step, s0s, rest):
    """A call that feeds each result's states back in as the next call's (donated) states."""
    box = [list(s0s)]

    def run():
        box[0] = list(step(tuple(box[0]), *rest))
        return box[0]
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for commit_fused.json")
    ap.add_argument("--tiny", action="store_true", help="a small shape in interpret mode (a CPU check)")
    ap.add_argument("--iters", type=int, default=20, help="calls in a timed trace")
    ap.add_argument("--forms", default="tf32x3,fma_loop,ieee", help="inner products to time (comma-separated)")
    ap.add_argument("--pers", default="1,4", help="layers a program (powers of two dividing the layers)")
    ap.add_argument("--bdvs", default="32,64", help="value columns a program (powers of two >= 16)")
    a = ap.parse_args(argv)
    tiny = a.tiny
    shape = dict(layers=4, b=2, h=4, hk=2, dk=32, dv=32) if tiny else dict(layers=48, b=1, h=48, hk=16, dk=128, dv=128)
    cases = [("chain16", 16, 16), ("tree65_path16", 65, 16)] + ([("ar1", 1, 1)] if not tiny else [])
    ints = lambda text: [int(x) for x in text.split(",")]
    variants = list(dict.fromkeys((f, per, min(bdv, shape["dv"])) for f in a.forms.split(",")
                                  for per in ints(a.pers) for bdv in ints(a.bdvs)))
    meta = dict(backend=jax.default_backend(), device=str(jax.devices()[0].device_kind), shape=shape, iters=a.iters)
    rows = []
    for name, n, path in cases:
        args = case(0, n=n, path=path, **shape)
        rep = shape["h"] // shape["hk"]
        xla = jax.jit(functools.partial(xla_update, rep=rep), donate_argnums=0)
        ref = [np.asarray(x) for x in xla(tuple(jnp.copy(s) for s in args[0]), *args[1:])]
        scale = max(float(np.abs(r).max()) for r in ref)
        todo = [("xla", None)] + [(f"{f}/per{per}/bdv{bdv}", (f, per, bdv)) for f, per, bdv in variants]
        for label, v in todo:
            if v is None:
                step = xla
            else:
                f, per, bdv = v

                def fused(s0s, *rest, f=f, per=per, bdv=bdv):
                    k, wd, eg = terms(*rest, form=f)
                    return fused_update(s0s, k, wd, eg, form=f, per=per, block_dv=bdv, interpret=tiny)
                step = jax.jit(fused, donate_argnums=0)
            try:
                t0 = time.perf_counter()
                got = [np.asarray(x) for x in step(tuple(jnp.copy(s) for s in args[0]), *args[1:])]
                compile_s = time.perf_counter() - t0
                err = max(float(np.abs(g - r).max()) for g, r in zip(got, ref)) / scale
                if tiny:   # the kept-back sequence's states must be its S0, bit for bit
                    assert all((g[-1] == np.asarray(s)[-1]).all() for g, s in zip(got, args[0])), label
                dev = profile.device_time(threaded(step, [jnp.copy(s) for s in args[0]], args[1:]), a.iters)
                row = dict(case=name, variant=label, device_us=dev.get("device_ms", float("nan")) * 1e3,
                           kernels=dev.get("kernels"), rel_err=err, compile_s=compile_s)
            except Exception as e:     # a variant that does not compile is a result, not the end of the sweep
                row = dict(case=name, variant=label, error=f"{type(e).__name__}: {str(e)[:300]}")
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(f"{a.out}/commit_fused.json", "w") as fh:       # as it goes: a cut-off call keeps its rows
                json.dump(dict(meta=meta, rows=rows), fh, indent=1)
    bad = [r for r in rows if "error" in r or r["rel_err"] > 1e-4]
    return 1 if bad and tiny else 0


if __name__ == "__main__":
    sys.exit(main())
