"""Tensor parallelism at any shape: TP = 1 vs TP = N token identity, then TP = N timings.

    PYTHONPATH=. python -m bench.tp --config real --tp 2 --out bench/results/tp2.json

1. Random weights (bench.rounds random_params) for the target and the DFlash drafter on device 0; greedy
   AR, DFlash and DDTree(B) from the same random prompt at TP = 1, then the same weights sharded TP = N
   (jaxspec/sharding.py): the tokens must be identical (reported per method with the first divergence:
   bf16 all-reduces sum in another order, so a near-tie on random weights could flip one).
2. All-reduce cost: the round's all-reduces (two per target layer of [1, N, D] and one for the embedding,
   two per drafter layer of [1, block, D]) timed alone at those sizes and counts, per round.
3. TP = N timings at each context (default 1K and 32K): AR step (= AR round), DFlash round, DDTree(B)
   round (inside the engine's device loop, per round), verify(block) and verify(B + 1) back to back.

Optional phases are skipped past --deadline-s; the JSON (commit, machine, date) is rewritten after each.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from bench import harness as H
from bench import rounds as R
from jaxspec import drafter as DR
from jaxspec import model as M
from jaxspec import sharding as S
from jaxspec import tree as trees
from jaxspec.dflash import DFlash
from jaxspec.drafter_config import qwen36_27b_dflash
from jaxspec.engine import Decoding, Engine

_T0 = time.perf_counter()


def log(msg):
    print(f"[tp {time.strftime('%H:%M:%S')} +{time.perf_counter() - _T0:.0f}s] {msg}", file=sys.stderr, flush=True)


def first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def speculators(drafter, cfg, budget):
    return {"ar": None, "dflash": DFlash(drafter, cfg) if drafter else None,
            f"ddtree{budget}": DFlash(drafter, cfg, budget=budget) if drafter else None}


def fresh(t: Decoding, state, draft):
    """A Decoding with this state and drafter state, the rest reset from `t` (a Decoding the engine returned,
    so that every array keeps the sharding the compiled round was compiled for)."""
    return Decoding(state, draft, t.pending * 1, t.out * 0, t.n_out * 0 + 1, t.done & False,
                    jax.random.fold_in(t.key, 1), t.hist * 0, t.rounds * 0)


def time_rounds(eng: Engine, template: Decoding, make_state, make_draft, max_new, rounds, repeats=3):
    """ms per round inside the engine's device loop (the same compiled _run as generate)."""
    d = fresh(template, make_state(), make_draft())
    d = eng._run(eng.params, d, max_new, rounds)
    jax.block_until_ready(d)
    per = []
    for _ in range(repeats):
        d = fresh(d, d.state, d.draft)
        t = time.perf_counter()
        d = eng._run(eng.params, d, max_new, rounds)
        jax.block_until_ready(d)
        per.append((time.perf_counter() - t) * 1e3 / max(int(d.rounds[0]), 1))
    return dict(median_ms=float(np.median(per)), min_ms=float(np.min(per)), rounds_per_call=rounds)


def allreduce_ms(mesh, shape, dtype, count, iters=5):
    """ms for `count` all-reduces (psum over the model axis) of `shape`, issued inside one jit."""
    x = jax.device_put(jnp.ones((S.tp_degree(mesh),) + tuple(shape), dtype),
                       jax.sharding.NamedSharding(mesh, P(S.MODEL)))

    def body(x):
        def step(i, y):
            return jax.lax.psum(y, S.MODEL) * jnp.asarray(0.5, y.dtype)
        return jax.lax.fori_loop(0, count, step, x)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(S.MODEL), out_specs=P(S.MODEL), check_vma=False))
    jax.block_until_ready(f(x))
    per = []
    for _ in range(iters):
        t = time.perf_counter()
        jax.block_until_ready(f(x))
        per.append((time.perf_counter() - t) * 1e3)
    return float(np.median(per))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.tp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny", help="'real' (Qwen3.6-27B + z-lab drafter shape) or 'tiny'")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel degree to compare with TP = 1 and time")
    ap.add_argument("--contexts", default="1024,32768", help="committed tokens for the timings")
    ap.add_argument("--budget", type=int, default=64, help="DDTree budget")
    ap.add_argument("--prompt", type=int, default=64, help="random prompt tokens for the identity check")
    ap.add_argument("--new", type=int, default=32, help="greedy tokens generated per method for the check")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per device-loop call in the timings")
    ap.add_argument("--k", type=int, default=10, help="back-to-back calls per verify timing")
    ap.add_argument("--skip-tp1", action="store_true", help="no TP = 1 identity check (timings only)")
    ap.add_argument("--deadline-s", type=float, default=420, help="skip optional phases after this many seconds")
    ap.add_argument("--out", default=None, help="JSON result path (rewritten after each phase)")
    args = ap.parse_args(argv)

    _, cfg = H.resolve_config(args.config, args.dtype)
    if args.config != "real":
        # Heads for TP up to 4 (kv heads repeated past 2) and a vocabulary that TP has to pad.
        cfg = cfg.replace(vocab_size=509, num_heads=8, linear_num_key_heads=4, linear_num_value_heads=8)
    dcfg = (qwen36_27b_dflash(args.dtype) if args.config == "real" else
            R.tiny_drafter(cfg).replace(num_heads=4, num_kv_heads=2, dtype=args.dtype))
    contexts = [int(c) for c in args.contexts.split(",") if c]
    res = dict(kind="tp", config=args.config, tp=args.tp, contexts=contexts, budget=args.budget,
               git=H.git_info(), machine=H.machine_info(), versions=H.versions(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(), identity={}, timings={},
               allreduce={}, skipped=[])

    def save():
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)

    def late(name):
        if time.perf_counter() - _T0 > args.deadline_s:
            res["skipped"].append(name)
            log(f"past the deadline: skipping {name}")
            save()
            return True
        return False

    mesh = S.make_mesh(args.tp, 1)
    S.check_target(cfg, args.tp)
    S.check_drafter(dcfg, args.tp)
    log(f"devices {jax.devices()}; mesh {dict(mesh.shape)}")
    dev0 = jax.devices()[0]
    with jax.default_device(dev0):
        model = R.random_params(lambda: M.Qwen35(cfg, rngs=nnx.Rngs(0)), 0)
        drafter = R.random_params(lambda: DR.Drafter(dcfg, rngs=nnx.Rngs(1)), 1)
    jax.block_until_ready((nnx.state(model), nnx.state(drafter)))
    log("random weights made")
    bs = dcfg.block_size
    ctx_max = max(contexts)
    max_len_small = max(contexts[0], args.prompt) + 64 * args.rounds * 4 + args.new + args.budget + 64
    prompt = np.random.RandomState(0).randint(0, cfg.vocab_size, args.prompt).tolist()

    # 1. identity TP = 1 vs TP = N (the engines at max_len_small are reused for the first context's timings)
    ref = {}
    if not args.skip_tp1:
        for name, spec in speculators(drafter, cfg, args.budget).items():
            t = time.perf_counter()
            out = Engine(model, spec).generate([prompt], args.new, max_len=max_len_small, rounds_per_call=args.rounds)
            ref[name] = out.tokens[0]
            log(f"TP=1 {name}: {len(ref[name])} tokens, tau {out.tau:.2f} ({time.perf_counter() - t:.1f}s)")
    t = time.perf_counter()
    smodel, sdrafter = S.shard_target(model, mesh), S.shard_drafter(drafter, mesh)
    jax.block_until_ready((nnx.state(smodel), nnx.state(sdrafter)))
    del model, drafter
    log(f"sharded TP={args.tp} in {time.perf_counter() - t:.1f}s")
    scfg, sdcfg = smodel.cfg, sdrafter.cfg
    engines, finals = {}, {}
    for name, spec in speculators(sdrafter, scfg, args.budget).items():
        t = time.perf_counter()
        eng = engines[name] = Engine(smodel, spec, mesh=mesh)
        out = eng.generate([prompt], args.new, max_len=max_len_small, rounds_per_call=args.rounds)
        got = out.tokens[0]
        finals[name] = out.final
        entry = dict(tokens_tp_n=got, tau=out.tau)
        if name in ref:
            div = first_divergence(ref[name], got)
            entry.update(identical=div is None, first_divergence=div, tokens_tp1=ref[name])
        res["identity"][name] = entry
        log(f"TP={args.tp} {name}: identical={entry.get('identical')} ({time.perf_counter() - t:.1f}s)")
        save()

    # 2. all-reduces per round at the round's sizes
    if not late("allreduce"):
        d, nl, nd = cfg.hidden_size, cfg.num_layers, dcfg.num_layers
        dt = jnp.dtype(cfg.dtype)
        plan = {"ar_round": [((1, 1, d), 2 * nl + 1)],
                "dflash_round": [((1, bs, d), 2 * nl + 1), ((1, bs, d), 2 * nd)],
                f"ddtree{args.budget}_round": [((1, args.budget + 1, d), 2 * nl + 1), ((1, bs, d), 2 * nd)]}
        for name, parts in plan.items():
            ms = sum(allreduce_ms(mesh, shape, dt, count) for shape, count in parts)
            res["allreduce"][name] = dict(ms_per_round=ms, ops=[dict(shape=list(s), count=c) for s, c in parts],
                                          note="target verify 2/layer + embedding; drafter draft 2/layer (its context K/V "
                                               "are per shard, no all-reduce)")
            log(f"allreduce {name}: {ms:.3f} ms per round")
        save()
    # 3. timings (the first context reuses the engines compiled above)
    def state_at(length, max_len):
        return lambda: S.put_state(mesh, lambda: H.random_state(scfg, 1, max_len, length))

    def cache_at(spec, length, max_len):
        if spec is None:
            return lambda: ()
        return lambda: S.put_state(mesh, lambda: R.random_cache(sdcfg, 1, max_len, length))

    fwd = jax.jit(lambda p, t, s, tr: nnx.merge(nnx.graphdef(smodel), p)(t, s, tr, taps=sdcfg.target_layer_ids)[0])
    params = nnx.state(smodel)
    tree = jnp.zeros((1, args.budget + 1), jnp.int32)
    parent = np.concatenate([[-1], np.arange(args.budget) // 4])       # a bushy tree of B + 1 nodes
    tr_tree = trees.from_parents(jnp.asarray(parent[None], jnp.int32))
    for ci, ctx in enumerate(contexts):
        max_len = max_len_small if ci == 0 else ctx + 64 * args.rounds * 4 + args.budget + 64
        ph = res["timings"][str(ctx)] = {}
        for name, eng in engines.items():
            if late(f"{name}_round@{ctx}"):
                continue
            if ci > 0:
                eng = Engine(smodel, eng.spec if name != "ar" else None, mesh=mesh)
            ph[f"{name}_round"] = time_rounds(eng, finals[name], state_at(ctx, max_len), cache_at(eng.spec if name != "ar" else None,
                                                                                    ctx, max_len),
                                              args.new, args.rounds)
            log(f"{ctx}: {name}_round {ph[f'{name}_round']}")
            save()
        for label, toks, tr in ((f"verify{bs}", jnp.ones((1, bs), jnp.int32), trees.chain(1, bs)),
                                (f"verify{args.budget + 1}", tree, tr_tree)):
            if late(f"{label}@{ctx}"):
                continue
            with jax.set_mesh(mesh):
                ph[label] = R.back_to_back(fwd, (params, toks, state_at(ctx, max_len)(), tr), args.k)
            log(f"{ctx}: {label} {ph[label]}")
            save()

    res["total_s"] = time.perf_counter() - _T0
    save()
    print(json.dumps({k: v for k, v in res.items() if k != "identity"} | {
        "identity": {k: {kk: vv for kk, vv in v.items() if not kk.startswith("tokens")} for k, v in res["identity"].items()}},
        indent=1))
    ok = all(v.get("identical", True) for v in res["identity"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
