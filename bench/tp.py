"""Tensor parallelism at any shape: TP = 1 vs TP = N token identity, then TP = N timings.

    PYTHONPATH=. python -m bench.tp --config real --tp 2 --out bench/results/tp2.json

1. Identity: random weights (bench.rounds random_params) for the target and the DFlash drafter on device
   0; greedy AR, DFlash and DDTree(B) from the same random prompt at TP = 1, then the same weights sharded
   TP = N (jaxspec/sharding.py): the tokens must be identical. By default this model has the real widths
   and head counts but --identity-layers layers, in --identity-dtype (float32, matmuls at full precision):
   random bf16 weights give near-flat logits, and on them even TP = 1 AR and TP = 1 DFlash part ways
   (bench/results/2026-11-29-h200x2-tp2-run1.json), since a 1-token and a 16-token forward round
   differently; a tie broken another way is not a sharding bug. --identity-dtype bfloat16
   --identity-layers 0 checks the full bf16 model all the same (first divergence reported).
2. All-reduce cost: the round's all-reduces (two per target layer of [1, N, D] and one for the embedding,
   two per drafter layer of [1, block, D]) timed alone at those sizes and counts, per round.
3. TP = N timings of the full model in --dtype at each context (default 1K and 32K): AR step (= AR round),
   DFlash round, DDTree(B) round (inside the engine's device loop from a random state, no prefill:
   bench.harness.engine_rounds), verify(block) and verify(B + 1) back to back. --tp 1 gives the TP = 1 row.

Phases are skipped past --deadline-s (0: no limit). While the run lasts, its JSON (commit, machine, date,
`complete: false`) is rewritten whole after each phase, as bench.harness does (bench/cli.StagedResult): where --out
holds a finished earlier result, to OUT.partial, and --out is replaced only when every phase asked for has run
(`complete: true`), so an interrupted, failed or late rerun leaves it whole. Exit status: 0 done (and the tokens
identical); 1 a method's TP = N tokens differ; 2 bad flags or a config that TP = N cannot shard; 3 phases skipped
past --deadline-s (named in a summary on stderr, with the file the partial result is in); 130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

from bench import harness as H
from bench import rounds as R
from bench.cli import StagedResult, at_least, exit_with, writable_dir, writable_file
from jaxspec import sharding as S
from jaxspec import tree as trees
from jaxspec.config import ConfigError
from jaxspec.dflash import DFlash
from jaxspec.drafter_config import qwen36_27b_dflash
from jaxspec.engine import Engine
from pallas_kernels import dispatch

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


def allreduce_ms(mesh, shape, dtype, count, iters=5):
    """ms for `count` all-reduces (psum over the model axis) of `shape`, issued one after another inside one
    jit: a loop of psums timed, less the same loop without them (1.03 ms per 129 iterations on an H200,
    bench/results/2026-11-30-h200x2-tp-table/tp1-a.json), so the loop's own cost is not charged to them."""
    x = jax.device_put(jnp.ones((S.tp_degree(mesh),) + tuple(shape), dtype),
                       jax.sharding.NamedSharding(mesh, P(S.MODEL)))

    def timed(reduce):
        def body(x):
            def step(i, y):
                return reduce(y) * jnp.asarray(0.5, y.dtype)
            return jax.lax.fori_loop(0, count, step, x)
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(S.MODEL), out_specs=P(S.MODEL), check_vma=False))
        jax.block_until_ready(f(x))
        per = []
        for _ in range(iters):
            t = time.perf_counter()
            jax.block_until_ready(f(x))
            per.append((time.perf_counter() - t) * 1e3)
        return float(np.median(per))
    return max(timed(lambda y: jax.lax.psum(y, S.MODEL)) - timed(lambda y: y), 0.0)


def fresh_copies(mesh, state):
    """A maker of fresh copies of `state` (placed once in its shardings), so that every timed run starts from
    the same random state. The random leaves come from one small jit per shape (harness._normal): made inside
    one jit with the mesh (sharding.state_maker), the 64-layer state took 2.5 min to compile on the H200
    (2026-11-30 logs, `jit__lambda`), once per context; a copy compiles in seconds."""
    if mesh is not None:
        shardings = S.state_shardings(mesh, state)
        state = jax.device_put(state, shardings)
    else:
        shardings = None
    copy = jax.jit(lambda s: jax.tree.map(jnp.copy, s), out_shardings=shardings)
    return lambda: copy(state)


def identity_configs(cfg, dcfg, layers: int, dtype: str):
    """The identity check's configs: the first `layers` target layers (0: all), the drafter's taps spread
    over them, both in `dtype`. `layers` is checked against the taps in `main` (before any work)."""
    if layers:
        cfg = cfg.replace(layer_types=cfg.layer_types[:layers])
        n = dcfg.n_taps
        dcfg = dcfg.replace(target_layer_ids=tuple(round(i * (layers - 1) / max(n - 1, 1)) for i in range(n)))
    return cfg.replace(dtype=dtype), dcfg.replace(dtype=dtype)


def check_identity(cfg, dcfg, mesh, args, res, save):
    """Greedy AR / DFlash / DDTree at TP = 1 on device 0, then the same weights sharded on `mesh`."""
    tp = S.tp_degree(mesh)
    with jax.default_device(jax.devices()[0]):
        model, drafter = R.random_pair(cfg, dcfg)
    prompt = np.random.RandomState(0).randint(0, cfg.vocab_size, args.prompt).tolist()
    max_len = args.prompt + args.new + args.budget + 64
    ref = {}
    for name, spec in speculators(drafter, cfg, args.budget).items():
        t = time.perf_counter()
        out = Engine(model, spec).generate([prompt], args.new, max_len=max_len, rounds_per_call=args.rounds)
        ref[name] = out.tokens[0]
        log(f"identity TP=1 {name}: {len(ref[name])} tokens, tau {out.tau:.2f} ({time.perf_counter() - t:.1f}s)")
    smodel, sdrafter = S.shard_target(model, mesh), S.shard_drafter(drafter, mesh)
    del model, drafter
    for name, spec in speculators(sdrafter, smodel.cfg, args.budget).items():
        t = time.perf_counter()
        out = Engine(smodel, spec, mesh=mesh).generate([prompt], args.new, max_len=max_len,
                                                        rounds_per_call=args.rounds)
        div = first_divergence(ref[name], out.tokens[0])
        res["identity"][name] = dict(identical=div is None, first_divergence=div, tau=out.tau,
                                     tokens_tp1=ref[name], tokens_tp_n=out.tokens[0])
        log(f"identity TP={tp} {name}: identical={div is None} ({time.perf_counter() - t:.1f}s)")
        save()


def time_rounds(cfg, dcfg, mesh, methods, contexts, args, res, save, late):
    """Phase 3: the full model (or its first --layers layers), sharded, from random states (no prefill): each
    method's rounds in the engine's device loop and verify(block) / verify(B + 1) back to back, per context."""
    bs = dcfg.block_size
    t = time.perf_counter()
    with jax.default_device(jax.devices()[0]):
        model, drafter = R.random_pair(cfg, dcfg)
    smodel, sdrafter = S.shard_target(model, mesh), S.shard_drafter(drafter, mesh)
    del model, drafter
    jax.block_until_ready((nnx.state(smodel), nnx.state(sdrafter)))
    log(f"timed model made and sharded TP={args.tp} in {time.perf_counter() - t:.1f}s")
    scfg, sdcfg = smodel.cfg, sdrafter.cfg
    res["layers"] = scfg.num_layers          # the layers of the model timed, as built
    fwd = jax.jit(lambda p, t, s, tr: nnx.merge(nnx.graphdef(smodel), p)(t, s, tr, taps=sdcfg.target_layer_ids)[0])
    params = nnx.state(smodel)
    tree = jnp.zeros((1, args.budget + 1), jnp.int32)
    parent = np.concatenate([[-1], np.arange(args.budget) // 4])       # a bushy tree of B + 1 nodes
    tr_tree = trees.from_parents(jnp.asarray(parent[None], jnp.int32))
    # One cache length for every context, so that each function compiles once. The reference attention
    # reads the whole cache whatever the length: at 1K with a 34K cache that is 1 GB of K/V more per step
    # over all GPUs (16 layers x 34K x 4 kv heads x 256 x 2 x 2 bytes), ~0.25 ms of one H200.
    max_len = max(contexts) + 64 * args.rounds * 4 + args.budget + 64
    res["max_len"] = max_len
    specs = speculators(sdrafter, scfg, args.budget)
    engines = {name: Engine(smodel, specs[name], mesh=mesh) for name in methods if name in specs}
    for ctx in contexts:
        # one compiled maker per context for every fresh state below (a new jit per call compiles each time)
        state_at = fresh_copies(mesh, H.random_state(scfg, 1, max_len, ctx))
        drafter_cache_at = fresh_copies(mesh, R.random_cache(sdcfg, 1, max_len, ctx))
        ph = res["timings"][str(ctx)] = {}
        for name, eng in engines.items():
            if late(f"{name}_round@{ctx}"):
                continue
            cache_at = (lambda: ()) if name == "ar" else drafter_cache_at
            t = time.perf_counter()
            ph[f"{name}_round"] = H.engine_rounds(eng, state_at(), cache_at(), args.rounds)
            log(f"{ctx}: {name}_round {ph[f'{name}_round']} ({time.perf_counter() - t:.0f}s with any compile)")
            if args.profile and ctx == contexts[0]:
                res.setdefault("profile", {})[name] = H.trace_rounds(
                    eng, H.decoding_at(eng, state_at(), cache_at()), args.rounds, 2, Path(args.profile))
                log(f"{ctx}: {name} trace {res['profile'][name]}")
            save()
        for label, toks, tr in ((f"verify{bs}", jnp.ones((1, bs), jnp.int32), trees.chain(1, bs)),
                                (f"verify{args.budget + 1}", tree, tr_tree)):
            if "verify" not in methods or late(f"{label}@{ctx}"):
                continue
            with jax.set_mesh(mesh):
                ph[label] = R.back_to_back(fwd, (params, toks, state_at(), tr), args.k)
            log(f"{ctx}: {label} {ph[label]}")
            save()


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every flag's default."""


def main(argv=None):
    global _T0
    _T0 = time.perf_counter()       # the deadline counts from this call, not from the import (tests import early)
    ap = argparse.ArgumentParser(prog="python -m bench.tp", description=__doc__,
                                 formatter_class=_Help)
    ap.add_argument("--config", default="tiny",
                    help="'real' (Qwen3.6-27B + z-lab drafter shape), 'tiny' (its heads and vocabulary made to shard "
                         "up to TP = 4), or a target config.json path (its shape as written, a tiny drafter with "
                         "heads for --tp)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="dtype of the timed model")
    ap.add_argument("--tp", type=at_least(1), default=2,
                    help="tensor-parallel degree to compare with TP = 1 and time")
    ap.add_argument("--contexts", default="1024,32768",
                    help="committed tokens for the timings ('': none, identity only)")
    ap.add_argument("--budget", type=at_least(1), default=64, help="DDTree budget")
    ap.add_argument("--prompt", type=at_least(1), default=64, help="random prompt tokens for the identity check")
    ap.add_argument("--new", type=at_least(1), default=32, help="greedy tokens generated per method for the check")
    ap.add_argument("--identity-layers", type=at_least(0), default=0,
                    help="target layers of the identity check's model (0: all; real widths either way)")
    ap.add_argument("--identity-dtype", default="float32", choices=("bfloat16", "float32"),
                    help="dtype of the identity check's model (float32 runs its matmuls at full precision)")
    ap.add_argument("--layers", type=at_least(0), default=0,
                    help="target layers of the timed model (0: all; real widths either way, drafter taps spread "
                         "over them): a quick probe of per-layer costs, e.g. TP overheads")
    ap.add_argument("--methods", default=None,
                    help="comma-separated subset of the timings (ar, dflash, ddtree<B> rounds; verify: verify(block) and "
                         "verify(B + 1)); none given: all")
    ap.add_argument("--rounds", type=at_least(1), default=8, help="rounds per device-loop call")
    ap.add_argument("--k", type=at_least(1), default=10, help="back-to-back calls per verify timing")
    ap.add_argument("--skip-identity", action="store_true", help="timings only")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="also trace each method's rounds at the first context into DIR (bench.harness.trace_rounds; "
                         "add XLA_FLAGS=--xla_dump_to=DIR/hlo --xla_dump_hlo_as_text for the HLO bench.profile reads)")
    ap.add_argument("--deadline-s", type=at_least(0, float), default=420,
                    help="skip the phases not started after this many seconds (0: no limit); exit status 3")
    ap.add_argument("--out", default=None,
                    help="JSON result path; a finished one there is replaced only when this run completes (meanwhile: "
                    "OUT.partial)")
    args = dispatch.parse_args(ap, argv)
    writable_file(ap, "--out", args.out)
    S.claim_device_memory()
    if args.profile:    # a directory, made if missing (was: FileExistsError after the first method's timing)
        writable_dir(ap, "--profile", args.profile, Path(args.profile))
    contexts = H.parse_contexts(ap, "--contexts", args.contexts) if args.contexts.strip() else []
    known = ["ar", "dflash", f"ddtree{args.budget}", "verify"]
    methods = args.methods.split(",") if args.methods else known
    if sorted(set(methods) - set(known)):
        ap.error(f"--methods {args.methods}: unknown {sorted(set(methods) - set(known))}; choose from {known}")
    if args.tp > jax.device_count():
        ap.error(f"--tp {args.tp}: needs {args.tp} devices, but {jax.device_count()} are visible "
                 f"({jax.default_backend()})")

    try:
        _, cfg = H.resolve_config(args.config, args.dtype)
    except (ConfigError, OSError) as e:
        ap.error(f"--config: {e}")
    if args.config == "tiny":
        # Heads for TP up to 4 (kv heads repeated past 2) and a vocabulary that TP has to pad.
        cfg = cfg.replace(vocab_size=509, num_heads=8, linear_num_key_heads=4, linear_num_value_heads=8)
    # The tiny drafter's heads: 4 q over 2 kv up to TP = 4; past it, as many as the smallest multiple of 4 and --tp
    # (kv heads half as many; the MLP 24 per head), so that a target config that shards --tp ways is not refused for
    # the bench's own drafter.
    heads = math.lcm(4, args.tp)
    dcfg = (qwen36_27b_dflash(args.dtype) if args.config == "real" else
            R.tiny_drafter(cfg).replace(num_heads=heads, num_kv_heads=heads // 2, intermediate_size=24 * heads,
                                        dtype=args.dtype))
    # Layer counts the models can be built with, checked here (was: a traceback, or exit 1, after minutes).
    counts = [("--layers", args.layers)] + ([] if args.skip_identity else [("--identity-layers", args.identity_layers)])
    for flag, layers in counts:
        if layers > cfg.num_layers:
            ap.error(f"{flag} {layers}: the {args.config} config has {cfg.num_layers} layers")
        if 0 < layers < dcfg.n_taps:
            ap.error(f"{flag} {layers}: the drafter taps {dcfg.n_taps} target layers; give at least that many "
                     "(0: all)")
    res = dict(kind="tp", config=args.config, tp=args.tp, contexts=contexts, budget=args.budget, dtype=args.dtype,
               layers=args.layers or cfg.num_layers,
               identity_layers=args.identity_layers or cfg.num_layers, identity_dtype=args.identity_dtype,
               git=H.git_info(), machine=H.machine_info(), versions=H.versions(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(), complete=False, identity={},
               timings={}, allreduce={}, skipped=[])
    staged = StagedResult(args.out) if args.out else None     # a finished earlier --out stays until this run completes

    def save():
        if staged:
            staged.save(res)

    def late(name):
        if args.deadline_s and time.perf_counter() - _T0 > args.deadline_s:
            res["skipped"].append(name)
            log(f"past the deadline: skipping {name}")
            save()
            return True
        return False

    try:
        mesh = S.make_mesh(args.tp, 1)
        S.check_target(cfg, args.tp)
        S.check_drafter(dcfg, args.tp)
    except ConfigError as e:
        ap.error(str(e))
    log(f"devices {jax.devices()}; mesh {dict(mesh.shape)}")
    try:
        return run(cfg, dcfg, mesh, methods, contexts, args, res, save, late, staged)
    except KeyboardInterrupt:
        log(f"interrupted: {args.out or 'no --out'}" + (f": so far in {staged.path}" if staged else ""))
        return 130


def run(cfg, dcfg, mesh, methods, contexts, args, res, save, late, staged):
    """The three phases, then the summary (and --out if every phase ran); main's exit status."""

    # 1. identity TP = 1 vs TP = N
    if not args.skip_identity:
        icfg, idcfg = identity_configs(cfg, dcfg, args.identity_layers, args.identity_dtype)
        res["identity_layers"] = icfg.num_layers
        precision = "highest" if args.identity_dtype == "float32" else None
        with jax.default_matmul_precision(precision):
            check_identity(icfg, idcfg, mesh, args, res, save)

    if args.layers:  # the timed model from here on
        cfg, dcfg = identity_configs(cfg, dcfg, args.layers, args.dtype)
    res["layers"] = cfg.num_layers          # the layers the all-reduce plan counts (time_rounds: those it built)

    # 2. all-reduces per round at the round's sizes
    bs = dcfg.block_size
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

    # 3. timings; none with --contexts '' (identity only)
    if contexts:
        time_rounds(cfg, dcfg, mesh, methods, contexts, args, res, save, late)

    res["total_s"] = time.perf_counter() - _T0
    res["complete"] = not res["skipped"]
    save()
    print(json.dumps({k: v for k, v in res.items() if k != "identity"} | {
        "identity": {k: {kk: vv for kk, vv in v.items() if not kk.startswith("tokens")} for k, v in res["identity"].items()}},
        indent=1))
    ok = all(v.get("identical", True) for v in res["identity"].values())
    if res["skipped"]:
        log(f"INCOMPLETE: {len(res['skipped'])} phase(s) skipped past --deadline-s {args.deadline_s:g}: "
            f"{', '.join(res['skipped'])}" + (f"; the result is in {staged.path}" if staged else ""))
        return 3 if ok else 1
    if staged:
        staged.finish(res)
    return 0 if ok else 1


if __name__ == "__main__":
    exit_with(main)
