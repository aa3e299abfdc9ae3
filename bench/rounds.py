"""Speculative rounds at any shape, on the one engine: AR step, DFlash draft / verify(16) /
accept+commit / round, DDTree tree build / verify(B+1) / accept+commit / round, MTP head step / draft
of k tokens / round (k = 1, 3, 5), each against the AR step of the same run. Random weights made on the
device (`bench.harness.build_params`).

    python -m bench.rounds --config real --context 1024 --budgets 16,32,64,128,256,512 --out r.json
    python -m bench.rounds --config real --context 1024,32768,131072 --rounds-only --out r.json

Several contexts share one cache length (the largest), so every function compiles once and each context
only changes the committed length. The reference attention reads the whole cache whatever the length;
the tree-attention kernel (the GPU default; JAXSPEC_TREE_ATTENTION=reference for the reference) reads only
the committed prefix and the tree.

Phase timings are back to back (K calls issued, then one sync; per call = total / K), which is how
they run inside the engine's device loop; rounds run inside the engine's own `while_loop`.

With --out, the result (its dtype and every flag under "settings") is written whole after each phase, marked
"complete": false until the last is done, as bench.harness does (bench/cli.StagedResult): where --out holds a
finished earlier result, the phases go to OUT.partial and --out is replaced only when this run completes, so an
interrupted or failed rerun leaves it whole.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gzip
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench import harness as H
from bench.cli import StagedResult, at_least, exit_with, writable_file
from bench.profile import device_time
from jaxspec import drafter as DR
from jaxspec import model as M
from jaxspec import mtp as MT
from jaxspec import tree as trees
from jaxspec.config import ConfigError
from jaxspec.ddtree import build_tree
from jaxspec.dflash import DFlash
from jaxspec.drafter_config import DrafterConfig, qwen36_27b_dflash
from jaxspec.engine import Engine, accept, loop_compiler_options
from jaxspec.sampling import Sampling, choose
from jaxspec.sharding import claim_device_memory, room_problem
from pallas_kernels import dispatch


def log(msg):
    print(f"[rounds {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def tiny_drafter(cfg) -> DrafterConfig:
    return DrafterConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=96, num_heads=4,
                         num_kv_heads=2, head_dim=16, layer_types=("sliding_attention", "full_attention"),
                         rope_theta=1e7, target_layer_ids=(0, 1), mask_token_id=cfg.vocab_size - 1, block_size=16,
                         sliding_window=64, dtype=cfg.dtype)


def random_params(module_fn, seed):
    graphdef, abstract = nnx.split(nnx.eval_shape(module_fn))
    leaves, treedef = jax.tree.flatten(abstract)
    key = jax.random.key(seed)
    params = jax.tree.unflatten(treedef, [H._normal(jax.random.fold_in(key, i), x.shape, jnp.dtype(x.dtype), 0.02)
                                          for i, x in enumerate(leaves)])
    return nnx.merge(graphdef, params)


def random_pair(cfg, dcfg):
    """A target and a DFlash drafter with random weights (random_params), on the default device, ready."""
    model = random_params(lambda: M.Qwen35(cfg, rngs=nnx.Rngs(0)), 0)
    drafter = random_params(lambda: DR.Drafter(dcfg, rngs=nnx.Rngs(1)), 1)
    jax.block_until_ready((nnx.state(model), nnx.state(drafter)))
    return model, drafter


def random_cache(dcfg, batch, max_len, length, seed=5):
    abstract = jax.eval_shape(lambda: DR.init_cache(dcfg, batch, max_len))
    key = jax.random.key(seed)
    rnd = lambda i, x: H._normal(jax.random.fold_in(key, i), x.shape, jnp.dtype(x.dtype), 1.0)
    n = len(abstract.keys)
    return DR.DrafterCache(jnp.full((batch,), length, jnp.int32), tuple(rnd(i, x) for i, x in enumerate(abstract.keys)),
                           tuple(rnd(n + i, x) for i, x in enumerate(abstract.values)))


def random_mtp_cache(cfg, rows, batch, max_len, length, seed=6) -> MT.MTPCache:
    """The MTP head's cache as if `length` tokens had been committed: rows 0..length-2 with random K/V,
    the last committed row waiting for the pending token (as after prefill)."""
    abstract = jax.eval_shape(lambda: MT.init_cache(cfg, batch, max_len, rows))
    key = jax.random.key(seed)
    rnd = lambda i, x: H._normal(jax.random.fold_in(key, i), x.shape, jnp.dtype(x.dtype), 1.0)
    zeros = lambda x: jnp.zeros(x.shape, x.dtype)
    return MT.MTPCache(jnp.full((batch,), length - 1, jnp.int32), rnd(0, abstract.keys), rnd(1, abstract.values),
                       rnd(2, abstract.hidden), zeros(abstract.next_tok), jnp.ones((batch,), jnp.int32),
                       zeros(abstract.drafts))


def back_to_back(fn, args, k=20, warmup=3, thread=None):
    """Median over 5 repeats of (k calls issued back to back, then one sync) / k, in ms; and the device
    time of a call (bench.profile.device_time: its kernels' summed durations, what it adds inside a round).

    thread=(arg, out): output `out` of each call becomes argument `arg` of the next, the way the engine
    threads its donated decoding state (`fn` then donates that argument)."""
    args = list(args)

    def call():
        out = fn(*args)
        if thread is not None:
            args[thread[0]] = out[thread[1]]
        return out
    for _ in range(warmup):
        jax.block_until_ready(call())
    per = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(k):
            out = call()
        jax.block_until_ready(out)
        per.append((time.perf_counter() - t) * 1e3 / k)
    return dict(median_ms=float(np.median(per)), min_ms=float(np.min(per)), k=k) | device_time(call)


def loop_is_graphed(spec) -> bool:
    """Whether the engine's round loop for `spec` compiles to a CUDA graph here (engine.loop_compiler_options)."""
    return jax.default_backend() == "gpu" and "xla_gpu_enable_command_buffer" in loop_compiler_options(spec)


def positive_ints(ap, flag: str, text: str, example: str, empty_ok: bool = False) -> list[int]:
    """Integers >= 1 from a comma-separated flag value (none only where empty_ok), or the parser's error naming it."""
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        ap.error(f"{flag} {text!r}: expected integers like {example}")
    if (not values and not empty_ok) or min(values, default=1) < 1:
        ap.error(f"{flag} {text!r}: expected integers >= 1 like {example}")
    return values


def pair_configs(config: str, dtype: str):
    """(target config, drafter config) for --config: 'demo' (the demo pair's shapes), 'real' (Qwen3.6-27B + z-lab's
    drafter), 'tiny', or a model directory / config.json (its target with the tiny drafter). ConfigError if none."""
    if config == "demo":
        # The demo pair's shapes (jaxspec/demo: the trained target and drafter's configs; random weights).
        from jaxspec.drafter_config import load_drafter_config
        from jaxspec.generate import demo_dir
        _, cfg = H.resolve_config(str(demo_dir() / "target" / "config.json"), dtype)
        return cfg, load_drafter_config(demo_dir() / "drafter" / "config.json", dtype=dtype)
    _, cfg = H.resolve_config(config, dtype)
    return cfg, qwen36_27b_dflash(dtype) if config == "real" else tiny_drafter(cfg)


def timed_room(groups, k: int, rounds: int, ar_rounds: int, block: int, round_budgets, mtp_tokens) -> dict:
    """{what: slots} the timed calls of each phase take past the context, each starting from a fresh state at it;
    the cache needs the longest context + 2 + the most of them. The tree build timings (--budgets) read only the
    drafter's logits, not the cache."""
    room = {"the AR step's 3 + 5 x --k calls": 3 + 5 * k}
    trees_used = [block] if groups & {"dflash", "ddtree"} else []
    trees_used += list(round_budgets) if "ddtree" in groups else []
    trees_used += [max(mtp_tokens)] if "mtp" in groups and mtp_tokens else []
    if trees_used:        # k commits of up to a block each, the rounds of the largest tree run
        room[f"(--k + 1) blocks of {block} + --rounds x (largest tree {max(trees_used)} + 1)"] = \
            (k + 1) * block + rounds * (max(trees_used) + 1)
    if "ar" in groups:    # the AR loop's calls (H.engine_rounds: 2 untimed + 4 x (1 + 4) timed) commit a token a round
        room["the AR loop's 22 calls x --ar-rounds"] = 22 * ar_rounds
    return room


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.rounds", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny",
                    help="'real' (Qwen3.6-27B + z-lab drafter shape), 'demo' (the demo pair's shapes, "
                         "jaxspec/demo), 'tiny' (default), or a model directory / config.json path (its target "
                         "shape with the tiny drafter)")
    ap.add_argument("--context", default="1024",
                    help="committed tokens before the timed rounds; a comma list (1024,32768,131072) times every "
                         "phase at each, with one cache length (the largest) so each function compiles once "
                         "(default: %(default)s)")
    ap.add_argument("--budgets", default="16,32,64,128,256,512",
                    help="DDTree budgets for tree build timing (default: %(default)s; the ddtree group without "
                         "--rounds-only)")
    ap.add_argument("--round-budget", default="64",
                    help="DDTree budget of the timed round; a comma list (63,64,79) times a round at each, in one "
                         "process (phases ddtree{B}_round; default: %(default)s)")
    ap.add_argument("--rounds", type=at_least(1), default=10, help="rounds per device loop call (default: %(default)s)")
    ap.add_argument("--ar-rounds", type=at_least(1), default=100,
                    help="rounds per call of the AR device loop (default: %(default)s; Engine.generate runs a whole "
                         "generation in one call, so its fixed host work per call is spread over its tokens)")
    ap.add_argument("--k", type=at_least(1), default=20,
                    help="back-to-back calls per phase timing (default: %(default)s)")
    ap.add_argument("--mtp-tokens", default="1,3,5", help="MTP draft tokens per round to time (default: %(default)s)")
    ap.add_argument("--phases", default="ar,dflash,ddtree,mtp",
                    help="groups to time: ar (the AR device loop), dflash, ddtree, mtp; the AR step always runs "
                         "(default: %(default)s)")
    ap.add_argument("--rounds-only", action="store_true",
                    help="skip the standalone verify / accept+commit / tree-build timings (the whole rounds, the AR "
                         "step and the draft steps still run): about half the run time")
    ap.add_argument("--max-len", type=at_least(1), default=None,
                    help="cache slots (default: room for long runs at every context). The reference attention "
                         "and the drafter read every slot, so a short generation's cost needs a short cache")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                    help="weights and activations (default: %(default)s; CPUs run float32 faster)")
    ap.add_argument("--trace-ar", action="store_true",
                    help="with the ar group: also profile the bare AR step and the engine's AR loop at the first "
                         "context and compare their kernels per step by part (phase 'ar_trace'; on a GPU the loop "
                         "only with JAXSPEC_LOOP_GRAPHS=none, as a CUDA graph hides its kernels)")
    ap.add_argument("--trace-rounds", action="store_true",
                    help="with dflash / ddtree: also profile two calls of the engine's round loop at the first context "
                         "and charge its kernels per round to the round's stages (draft, DDTree's build, verify, accept, "
                         "commit, draft_update, the loop's own) and to the model's parts (phase '<method>_trace'; on a GPU "
                         "only with JAXSPEC_LOOP_GRAPHS=none, as a CUDA graph hides its kernels)")
    ap.add_argument("--sampling", default="0",
                    help="the engine's round loops (AR, DFlash, DDTree, MTP) sample at TEMPERATURE[,TOP_K[,TOP_P]] "
                         "(default 0: greedy); the standalone phases stay greedy")
    ap.add_argument("--out", default=None,
                    help="JSON file, rewritten after every phase (a killed run keeps its data); a finished one there "
                         "is replaced only when this run completes (meanwhile: OUT.partial)")
    args = dispatch.parse_args(ap, argv)
    writable_file(ap, "--out", args.out)
    claim_device_memory()
    try:
        fields = [float(f) for f in args.sampling.split(",")]
        if len(fields) > 3 or (len(fields) > 1 and fields[1] != int(fields[1])):
            raise ValueError(f"expected at most 3 fields with an integer top-k, got {len(fields)}")
        sampling = Sampling(fields[0], *([int(fields[1])] if len(fields) > 1 else []), *fields[2:])
    except ValueError as e:
        ap.error(f"--sampling {args.sampling!r}: TEMPERATURE[,TOP_K[,TOP_P]] ({e})")
    groups = {g for g in args.phases.split(",") if g}
    if groups - {"ar", "dflash", "ddtree", "mtp"}:      # first: a typo is named, not the flags it leaves unmet
        ap.error(f"--phases: unknown group(s) {sorted(groups - {'ar', 'dflash', 'ddtree', 'mtp'})}; "
                 "choose from ar,dflash,ddtree,mtp")
    if args.trace_ar and "ar" not in groups:
        ap.error("--trace-ar needs the ar group in --phases")
    if args.trace_rounds and not groups & {"dflash", "ddtree"}:
        ap.error("--trace-rounds needs the dflash or ddtree group in --phases")

    try:
        cfg, dcfg = pair_configs(args.config, args.dtype)
    except ConfigError as e:
        ap.error(f"--config {args.config!r}: {e}")
    budgets = positive_ints(ap, "--budgets", args.budgets, "16 or 16,32,64", empty_ok=True)
    round_budgets = positive_ints(ap, "--round-budget", args.round_budget, "64 or 63,64,79")
    mtp_tokens = positive_ints(ap, "--mtp-tokens", args.mtp_tokens, "1 or 1,3,5", empty_ok=True)
    bs = dcfg.block_size
    contexts = H.parse_contexts(ap, "--context", args.context)
    # Room for the timed calls past the longest context, the most any one of them takes.
    room = timed_room(groups, args.k, args.rounds, args.ar_rounds, bs, round_budgets, mtp_tokens)
    need = max(contexts) + 2 + max(room.values())
    # Past the model's context limit (Engine.generate refuses it) no generation runs: refused, not timed. The slots
    # the timed calls take are counted as its tokens (at most a tree more).
    H.context_limit(ap, "--context", max(contexts), need - max(contexts), "slots the timed calls take past it",
                    cfg.max_position_embeddings)
    max_len = args.max_len or max(max(contexts) + 64 * args.rounds * 8 + 1100, need)
    if max_len < need:
        ap.error(f"--max-len {max_len}: the timed calls need {need} slots (context {max(contexts)} + 2 + the most "
                 f"of: {'; '.join(f'{what} = {n}' for what, n in room.items())})")
    result = dict(kind="rounds", complete=False, config=args.config,
                  context=contexts[0] if len(contexts) == 1 else contexts, max_len=max_len, block_size=bs,
                  dtype=args.dtype, sampling=dataclasses.asdict(sampling),
                  settings={k: v for k, v in vars(args).items() if k != "out"}, git=H.git_info(),
                  machine=H.machine_info(), versions=H.versions(),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat())
    staged = StagedResult(args.out) if args.out else None   # a finished earlier --out stays until this run completes
    # One context: the flat layout of earlier runs ("phases", "vs_ar_step"); several: "contexts" and "ratios"
    # keyed by the context, each against the AR step at that context.
    tables = {c: {} for c in contexts}
    if len(contexts) == 1:
        result["phases"] = tables[contexts[0]]
    else:
        result["contexts"] = {str(c): t for c, t in tables.items()}
    made = {}

    def memo(name, make):
        if name not in made:
            made[name] = make()
        return made[name]

    def save(final=False):
        for ctx, ctx_ph in tables.items():
            timed = {k: v["median_ms"] for k, v in ctx_ph.items() if isinstance(v, dict) and "median_ms" in v}
            ratios = {}
            if "ar_step" in ctx_ph:
                ratios["vs_ar_step"] = {k: v / ctx_ph["ar_step"]["median_ms"] for k, v in timed.items()}
            if "roofline_ms_at_4.30TB_s" in result:
                ratios["vs_roofline"] = {k: v / result["roofline_ms_at_4.30TB_s"] for k, v in timed.items()}
            if len(contexts) == 1:
                result.update(ratios)
            else:
                result.setdefault("ratios", {})[str(ctx)] = ratios
        if staged:
            staged.finish(result) if final else staged.save(result)

    if staged and staged.keeps_earlier:
        log(f"{args.out} holds an earlier result, replaced only when this run completes (until then: {staged.path})")
    log(f"devices {jax.devices()}")
    result["copy"] = H.measure_copy(2.0 if args.config == "real" else 0.01, 5)
    t = time.perf_counter()
    model, drafter = random_pair(cfg, dcfg)
    log(f"random weights in {time.perf_counter() - t:.1f}s")
    # The phases hold a target state and a drafter cache of max_len slots at once, beside the weights: where
    # even those cannot fit, stop now (session 57: on an 80 GB card the 128K cache stalled the run for 9 min).
    problem = room_problem(jax.eval_shape(lambda: (M.init_state(cfg, 1, max_len), DR.init_cache(dcfg, 1, max_len))),
                           None, f"a target state and a drafter cache of max_len {max_len} (the longest --context "
                           f"{max(contexts)} and the timed calls' room)")
    if problem:
        raise SystemExit(f"error: {problem}; time fewer or shorter --context values")
    pb = H.param_bytes(cfg, nnx.state(model))
    result["weight_bytes_per_step"] = pb["decode_weight_bytes"]
    result["roofline_ms_at_4.30TB_s"] = pb["decode_weight_bytes"] / 4.30e12 * 1e3
    gd, tp = nnx.split(model)
    dgd, dp = nnx.split(drafter)
    pending = jnp.ones((1,), jnp.int32)

    def trace_ar(step, eng, ctx):
        """Where the device loop's extra time a round goes (session 21: the engine's AR loop took 15.06 ms a
        round with calls queued, the bare step 14.65 back to back): `rounds` bare steps and two queued loop calls
        of `rounds` rounds each profiled, their kernels charged to the model's parts (bench.profile.summarize
        on each program's optimized HLO), per step / round: kernel time, span, gaps, kernels by part."""
        st = [H.random_state(cfg, 1, max_len, ctx), jnp.ones((1, 1), jnp.int32)]
        d = [H.decoding_at(eng, H.random_state(cfg, 1, max_len, ctx), ())]
        # Compiled once each, ahead of time: the programs profiled are the ones whose HLO names the kernels.
        step_c = step.lower(tp, st[0], st[1]).compile()
        loop_c = eng._run.lower(eng.params, d[0], H.ENDLESS, args.rounds).compile()

        def one_step():
            st[0], st[1] = step_c(tp, st[0], st[1])
            return st[1]

        def one_call():
            d[0] = loop_c(eng.params, d[0], H.ENDLESS, args.rounds)
            return d[0]

        forms = (("ar_step", one_step, args.rounds, args.rounds, step_c),
                 ("ar_round_device_loop", one_call, 2, 2 * args.rounds, loop_c))
        out = {}
        if loop_is_graphed(eng.spec):
            # In a CUDA graph the profiler sees few of the loop's kernels (session 42: 108 of the step's 1104 a
            # round, bench/results/2026-12-04-h200-s42/parts/), so a comparison by part would be meaningless.
            forms = forms[:1]
            out["ar_round_device_loop"] = {"not_traced": "the AR loop runs as one CUDA graph (JAXSPEC_LOOP_GRAPHS): "
                                           "its kernels are not traced one by one; set JAXSPEC_LOOP_GRAPHS=none"}
        for name, fn, calls, per, compiled in forms:
            jax.block_until_ready(fn())
            s = H.profile_steps(fn, calls, None, compiled.as_text(), None, name, per=per, top=40)
            if "error" in s:
                raise RuntimeError(f"--trace-ar: {s['error']} for {name}")
            out[name] = {k: s[k] for k in ("kernel_ms_per_step", "span_ms_per_step", "gap_ms_per_step",
                                           "kernels_per_step", "gemm_ms_per_step", "other_kernels_ms_per_step")}
            out[name]["by_part_ms"] = {k: v["ms_per_step"] for k, v in s["by_part"].items()}
            out[name]["top_kernels"] = s["top_kernels"]
        a, b = out["ar_step"], out["ar_round_device_loop"]
        if "not_traced" in b:
            return out
        out["loop_minus_step"] = {k: b[k] - a[k] for k in ("kernel_ms_per_step", "span_ms_per_step",
                                                           "gap_ms_per_step", "kernels_per_step")}
        out["loop_minus_step"]["by_part_ms"] = {k: b["by_part_ms"].get(k, 0.0) - a["by_part_ms"].get(k, 0.0)
                                                for k in sorted(set(a["by_part_ms"]) | set(b["by_part_ms"]))}
        return out

    def trace_round(eng, ctx, name):
        """Where a speculative round's time goes: two calls of the engine's round loop (`rounds` rounds each)
        profiled, compiled with the round's stages and the model's parts named, per round: kernel time, span,
        gaps, kernels, time by stage (bench.harness.STAGES) and by part, every kernel; with --out, the loop's
        optimized HLO in OUT.<name>.hlo.txt.gz."""
        if loop_is_graphed(eng.spec):
            return {"not_traced": "the round loop runs as one CUDA graph (JAXSPEC_LOOP_GRAPHS): its kernels are not "
                                  "traced one by one; set JAXSPEC_LOOP_GRAPHS=none"}
        d = [H.decoding_at(eng, H.random_state(cfg, 1, max_len, ctx), random_cache(dcfg, 1, max_len, ctx))]
        # A jit of its own: eng._run's trace is cached from the timed calls, made without the names.
        run = jax.jit(lambda p, d, m, r: eng._run_rounds(p, d, m, r), donate_argnums=(1,))
        with H.named_stages(eng.spec), H.named_parts():
            loop_c = run.lower(eng.params, d[0], H.ENDLESS, args.rounds).compile()

        def one_call():
            d[0] = loop_c(eng.params, d[0], H.ENDLESS, args.rounds)
            return d[0]

        jax.block_until_ready(one_call())
        hlo = loop_c.as_text()
        if args.out:        # the loop's optimized HLO beside the JSON, to read a fusion's name as its ops
            with gzip.open(f"{args.out}.{name}.hlo.txt.gz", "wt") as f:
                f.write(hlo)
        s = H.profile_steps(one_call, 2, None, hlo, None, "rounds", per=2 * args.rounds, top=100000, stages=True)
        if "error" in s:
            raise RuntimeError(f"--trace-rounds: {s['error']}")
        out = {k: s[k] for k in ("kernel_ms_per_step", "span_ms_per_step", "gap_ms_per_step", "kernels_per_step",
                                 "gemm_ms_per_step", "other_kernels_ms_per_step")}
        out["by_stage"] = s["by_stage"]
        out["by_part_ms"] = {k: v["ms_per_step"] for k, v in s["by_part"].items()}
        out["kernels"] = s["top_kernels"]          # every kernel, longest first
        return out

    def measure(ctx, ph):
        """Every phase at one context; jitted functions and engines are made once (memo) and reused."""
        # AR step, back to back and inside the engine's device loop.
        step = memo("ar_step", lambda: jax.jit(H.make_decode_step(gd, cfg, 1), donate_argnums=(1,)))
        st = H.random_state(cfg, 1, max_len, ctx)
        tok = jnp.ones((1, 1), jnp.int32)
        for _ in range(3):
            st, tok = step(tp, st, tok)
        jax.block_until_ready(st)
        per = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(args.k):
                st, tok = step(tp, st, tok)
            jax.block_until_ready(tok)
            per.append((time.perf_counter() - t) * 1e3 / args.k)
        ph["ar_step"] = dict(median_ms=float(np.median(per)), min_ms=float(np.min(per)), k=args.k)
        del st
        log(f"ar_step {ph['ar_step']}")
        save()

        def engine_rounds(spec, name, cache=None, rounds=args.rounds):
            eng = memo(name, lambda: Engine(model, spec() if spec else None, sampling))
            st = H.random_state(cfg, 1, max_len, ctx)
            if cache is None:
                cache = random_cache(dcfg, 1, max_len, ctx) if spec is not None else ()
            ph[name] = H.engine_rounds(eng, st, cache, rounds)
            log(f"{name} {ph[name]}")
            save()
            if args.trace_rounds and spec is not None and name != "ar_round_device_loop" and ctx == contexts[0] \
                    and not name.startswith("mtp"):
                trace = name.replace("_round", "_trace")
                ph[trace] = trace_round(eng, ctx, trace)
                stages = {k: round(v["ms_per_step"], 3) for k, v in ph[trace].get("by_stage", {}).items()}
                log(f"{trace} {stages or ph[trace]['not_traced']}")
                save()

        if "ar" in groups:
            engine_rounds(None, "ar_round_device_loop", rounds=args.ar_rounds)
            if args.trace_ar and ctx == contexts[0]:
                ph["ar_trace"] = trace_ar(step, made["ar_round_device_loop"], ctx)
                tr = ph["ar_trace"]
                log(f"ar_trace {tr.get('loop_minus_step') or tr['ar_round_device_loop']['not_traced']}")
                save()

        if groups & {"dflash", "ddtree"}:
            # DFlash phases.
            # The drafter's cache is donated and threaded too: a draft writes its block into the full layers'
            # scratch rows, which an undonated cache would first copy whole.
            draft = memo("draft", lambda: jax.jit(
                lambda dp, tp, c, a: nnx.merge(dgd, dp).draft(c, a, nnx.merge(gd, tp).embed_tokens[...],
                                                              nnx.merge(gd, tp).unembedding(), bs),
                donate_argnums=(2,)))
            ph["draft"] = back_to_back(draft, (dp, tp, random_cache(dcfg, 1, max_len, ctx), pending), args.k,
                                       thread=(2, 1))
            log(f"draft {ph['draft']}")
            logits, _ = draft(dp, tp, random_cache(dcfg, 1, max_len, ctx), pending)

            # The state is donated and threaded from call to call, as in the engine's round (an undonated
            # state makes every call copy the whole KV cache).
            fwd = memo("verify", lambda: jax.jit(
                lambda tp, toks, st, tr: nnx.merge(gd, tp)(toks, st, tr, taps=dcfg.target_layer_ids), donate_argnums=(2,)))

            def accept_commit(tp, st, pend, tr, toks, lg):
                path, n, bonus = accept(tr, toks, choose(None, lg, Sampling()))
                return M.commit(st, pend, tr, path, n), bonus
            ac = memo("accept_commit", lambda: jax.jit(accept_commit, donate_argnums=(1,)))

            def verify_phases(toks, tr, name):
                if args.rounds_only:
                    return
                st = H.random_state(cfg, 1, max_len, ctx)
                ph[f"verify_{name}"] = back_to_back(fwd, (tp, toks, st, tr), args.k, thread=(2, 2))
                lg, _, st2, pend = fwd(tp, toks, H.random_state(cfg, 1, max_len, ctx), tr)
                # Each commit advances the length by up to the tree depth: max_len leaves room for the calls.
                ph[f"accept_commit_{name}"] = back_to_back(ac, (tp, st2, pend, tr, toks, lg), args.k, thread=(1, 0))
                log(f"verify/accept_commit {name}: {ph[f'verify_{name}']} {ph[f'accept_commit_{name}']}")
                save()

        if "dflash" in groups:
            chain_toks = jnp.concatenate([pending[:, None], jnp.argmax(logits, -1).astype(jnp.int32)], 1)
            verify_phases(chain_toks, trees.chain(1, bs), f"chain{bs}")
            engine_rounds(lambda: DFlash(drafter, cfg), "dflash_round")

        if "ddtree" in groups:
            # DDTree phases.
            logp = jax.nn.log_softmax(logits, -1)
            ph["tree_build"] = {}
            for b in [] if args.rounds_only else budgets:
                f = memo(f"tree_build{b}", lambda b=b: jax.jit(lambda lp, a: build_tree(lp, a, b)))
                ph["tree_build"][str(b)] = back_to_back(f, (logp, pending), args.k)
            if ph["tree_build"]:
                log(f"tree_build {ph['tree_build']}")
            else:
                del ph["tree_build"]
            for b in round_budgets:
                tr = build_tree(logp, pending, b)
                verify_phases(tr.tokens, tr.tree, f"tree{b + 1}")
                engine_rounds(lambda b=b: DFlash(drafter, cfg, budget=b), f"ddtree{b}_round")

        if "mtp" in groups:
            # MTP phases: the checkpoint's head (random weights at the target's shape), its cache at the context.
            head = memo("mtp_head", lambda: random_params(lambda: MT.MTPHead(cfg, rngs=nnx.Rngs(2)), 2))
            result["mtp_head_bytes"] = H.param_bytes(cfg, nnx.state(head))["total"]
            hgd, hp = nnx.split(head)
            mc = random_mtp_cache(cfg, 2, 1, max_len, ctx)

            def mtp_step(hp, tp, c, a):
                # One recursive draft step: a head row at the context's end, then the shared lm_head.
                t = nnx.merge(gd, tp)
                o, _, _ = nnx.merge(hgd, hp)(t.embed(a[:, None]), c.hidden[:, :1], c.keys, c.values, c.length)
                return jnp.einsum("bd,dv->bv", o[:, 0], t.unembedding())
            ph["mtp_step"] = back_to_back(memo("mtp_step", lambda: jax.jit(mtp_step)), (hp, tp, mc, pending), args.k)
            log(f"mtp_step {ph['mtp_step']}")
            for k in mtp_tokens:
                spec = memo(f"mtp{k}", lambda k=k: MT.MTP(head, cfg, k))
                mc = random_mtp_cache(cfg, spec.tree_size, 1, max_len, ctx)
                propose = memo(f"mtp_propose{k}", lambda spec=spec: jax.jit(
                    lambda hp, tp, c, a, key: spec.propose(hp, nnx.merge(gd, tp), c, a, key, Sampling())))
                ph[f"mtp_draft_k{k}"] = back_to_back(propose, (spec.params, tp, mc, pending, jax.random.key(0)), args.k)
                log(f"mtp_draft_k{k} {ph[f'mtp_draft_k{k}']}")
                engine_rounds(lambda spec=spec: spec, f"mtp{k}_round", mc)


    for ctx in contexts:
        log(f"context {ctx}")
        measure(ctx, tables[ctx])
    result["complete"] = True
    save(final=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    exit_with(main)
