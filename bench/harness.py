"""Jitted benchmark of the target model: device ceilings, prefill and the AR decode step.

    python -m bench.harness --config real --contexts 1024,32768 --out run.json

One run measures, on whatever device JAX sees:
  * the ceilings: device-to-device copy bandwidth (bytes read + written) and the bf16 matmul rate;
  * prefill of a P-token prompt (a chain forward that commits as it goes: `Qwen35(commit_n=...)`), with the FLOP rate;
    with `--prefill-chunks`, also the engine's own prefill of that prompt in pieces (what generate's first token
    waits for);
  * the AR decode step (forward of one token on top of a context, commit, argmax) at each context,
    against the HBM roofline (bytes that must be read / measured copy bandwidth);
  * optionally a kernel profile of the step, charged to the model's parts (attention, GDN, MLP, ...),
    and a breakdown that times each part alone on the same weights.

Weights are random, generated on the device inside jit (no host copy of the 54 GB). To time decode at a
context C the context is not prefilled: the state gets length C and a random KV cache, which is the same
work. The result is one JSON file (`--out`); bench/results/ keeps the ones that matter.

The result is written after each phase, each time whole (a temporary file moved into place), with "complete":
false until the last phase is done and "complete": true then. A run never loses a finished earlier result: where
--out already holds one (any file not marked "complete": false), the phases go to OUT.partial instead and --out
is replaced only by a complete result (OUT.partial is then removed); a run that fails or is interrupted leaves the
earlier --out whole and what it measured in OUT.partial.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import gzip
import json
import os
import platform
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench import profile
from bench.cli import StagedResult, at_least, exit_with, writable_dir, writable_file, write_json
from jaxspec import model as M
from jaxspec.config import FULL, LINEAR, ConfigError, TargetConfig, load_target_config, qwen36_27b
from jaxspec.provenance import git_info
from jaxspec.sharding import FRACTION_VARS, claim_device_memory, room_problem
from jaxspec.tree import chain
from pallas_kernels import dispatch

REPO = Path(__file__).resolve().parent.parent
_T0 = time.perf_counter()
_LOG: list = []   # an open file that log() also writes to (--log), whatever happens to stdout


def log(msg: str) -> None:
    line = f"[{time.perf_counter() - _T0:7.1f}s] {msg}"
    print(line, flush=True)
    for f in _LOG:
        f.write(line + "\n")
        f.flush()


# ----------------------------------------------------------------------------------------------- config

def tiny_config(dtype: str = "bfloat16") -> TargetConfig:
    """The shape of tests/conftest.py's tiny HF model: every code path, seconds on a CPU."""
    return TargetConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128,
        layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(4)),
        num_heads=4, num_kv_heads=2, head_dim=32, rotary_dim=8, rope_theta=1e7,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=16,
        conv_kernel=4, dtype=dtype)


def resolve_config(name: str, dtype: str) -> tuple[str, TargetConfig]:
    if name == "real":
        return "qwen36_27b", qwen36_27b(dtype)
    if name == "tiny":
        return "tiny", tiny_config(dtype)
    return str(name), load_target_config(name, dtype=dtype)


# ---------------------------------------------------------------------------------------------- timing

def parse_contexts(ap, flag: str, text: str, what: str = "token counts") -> list[int]:
    """Distinct positive integers below 2**31 (`what` they count; the device's lengths are int32) from a
    comma-separated flag value, or the parser's error naming the flag."""
    try:
        contexts = [int(c) for c in text.split(",") if c]
    except ValueError:
        ap.error(f"{flag}: expected integers separated by commas, got {text!r}")
    if not contexts or min(contexts) < 1:
        ap.error(f"{flag}: expected positive {what}, got {text!r}")
    if max(contexts) >= 2**31:
        ap.error(f"{flag}: expected {what} below 2**31 = {2**31}, got {text!r}")
    if len(set(contexts)) < len(contexts):
        twice = sorted({c for c in contexts if contexts.count(c) > 1})
        ap.error(f"{flag}: {', '.join(map(str, twice))} given more than once in {text!r}; give each once")
    return contexts


def context_limit(ap, flag: str, length: int, after: int, what: str, bound: int) -> None:
    """The parser's error naming `flag` where `length` tokens and the `after` tokens past them (`what` those are)
    exceed the model's context limit `bound` (its config's max_position_embeddings; 0: none), which Engine.generate
    refuses for a prompt and its new tokens (jaxspec.engine.context_problem): a setup no generation can run."""
    if bound and length + after > bound:
        ap.error(f"{flag} {length}: + {after} {what} exceeds the model's context limit (max_position_embeddings "
                 f"{bound}); at most {bound - after}")


def summarize(ms) -> dict:
    a = np.asarray(ms, np.float64)
    return dict(median_ms=float(np.median(a)), p10_ms=float(np.percentile(a, 10)),
                p90_ms=float(np.percentile(a, 90)), min_ms=float(a.min()), mean_ms=float(a.mean()), n=len(a))


def time_calls(fn, warmup: int, iters: int) -> dict:
    """fn runs one iteration and blocks on its result (device-synchronised)."""
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1e3)
    return summarize(ms)


def time_kernel(run, iters: int) -> dict:
    """A kernel benchmark's timing of `run()` (a jitted call): its first output, the seconds of that first call
    (compile included), the median of `iters` synchronised calls and the device time of one call (the kernels'
    summed durations in a trace, bench.profile.device_time), both in seconds. The first call's exception, e.g.
    a tuning variant that does not compile, propagates."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(run())
    compile_s = time.perf_counter() - t0
    wall = time_calls(lambda: jax.block_until_ready(run()), 0, iters)["median_ms"] / 1e3
    device = profile.device_time(run).get("device_ms", float("nan")) / 1e3
    return dict(out=out, compile_s=compile_s, wall_s=wall, device_s=device)


def layer_bench(argv, doc: str, impls: dict, stack_for, link, layers: int, sizes: str = "16,64,65") -> list[dict]:
    """A per-layer op benchmark (the GDN ops' benches): per block size n (--sizes), `stack_for(n, layers)` gives
    --layers argument tuples; one jit applies each implementation to them in sequence, `link(args, out)` making
    each layer's input depend on the previous output (so nothing is hoisted), and returns every layer's outputs (so
    nothing is dropped). Per implementation: time per layer, synchronised and on the device (time_kernel), the bytes
    a layer reads and writes over that time, and the largest relative error of any output against the first
    implementation's (the last layer's outputs); rows printed and, with --json, written."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=sizes, help="nodes per block (comma-separated)")
    p.add_argument("--layers", type=at_least(1), default=layers, help="layers applied in sequence per timed call")
    p.add_argument("--iters", type=at_least(1), default=20, help="timed calls per (size, implementation)")
    p.add_argument("--json", help="also write the rows to this JSON file")
    a = dispatch.parse_args(p, argv)
    sizes = parse_contexts(p, "--sizes", a.sizes, "block sizes")
    writable_file(p, "--json", a.json)         # before the timing, not after it
    f32 = jnp.float32
    rows = []
    for n in sizes:
        stack = stack_for(n, a.layers)
        ref = None
        for name, fn in impls.items():
            def run(stack, fn=fn):
                # every layer's outputs are returned: were only the last one's, XLA would drop what of the earlier
                # layers' work `link` does not read (session 77: the GDN tree inputs' reference at 1.4 us a layer)
                outs = []
                for args in stack:
                    outs.append(fn(*(args if not outs else link(args, outs[-1]))))
                return outs
            step = jax.jit(run)                      # one jit per (size, impl): timing it must not retrace
            t = time_kernel(lambda: step(stack), a.iters)
            outs = [x.astype(f32) for x in jax.tree.leaves(t["out"][-1])]
            ref = outs if ref is None else ref
            err = max(float(jnp.max(jnp.abs(x - r)) / jnp.max(jnp.abs(r))) for x, r in zip(outs, ref))
            moved = sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves((stack[0], t["out"][-1])))
            per, dev = t["wall_s"] / a.layers, t["device_s"] / a.layers
            rate = moved / dev if dev > 0 else float("nan")          # no kernel in the trace: no rate
            print(f"N={n:4d} {name:14s} {per * 1e6:8.1f} us/layer (device {dev * 1e6:6.1f})  "
                  f"{rate / 1e12:5.2f} TB/s on the device  err {err:.1e}  compile {t['compile_s']:.1f} s",
                  flush=True)
            rows.append(dict(n=n, impl=name, us_per_layer=per * 1e6, device_us_per_layer=dev * 1e6,
                             bytes_per_layer=moved, device_bytes_per_s=rate, rel_err_vs_reference=err,
                             compile_s=t["compile_s"]))
    if a.json:
        write_results(a.json, rows, layers=a.layers)
    return rows


# The model's parts, named in the HLO metadata while tracing so that profiled kernels can be charged
# to them. The wrappers only add jax.named_scope; the computation is unchanged.
_SCOPED = ((M.Attention, "__call__", "attn"), (M.GatedDeltaNet, "__call__", "gdn"), (M.MLP, "__call__", "mlp"),
           (M.RMSNorm, "__call__", "norm"), (M.Qwen35, "logits", "head"), (M.Qwen35, "embed", "embed"))


def _in_scope(fn, name: str):
    """fn, its ops named under jax.named_scope(name) when traced."""
    @functools.wraps(fn)
    def wrapped(*a, **kw):
        with jax.named_scope(name):
            return fn(*a, **kw)
    return wrapped


@contextlib.contextmanager
def named_parts():
    saved = []
    for cls, attr, name in _SCOPED:
        fn = cls.__dict__[attr]
        saved.append((cls, attr, fn))
        setattr(cls, attr, _in_scope(fn, name))
    try:
        yield
    finally:
        for cls, attr, fn in saved:
            setattr(cls, attr, fn)


# The stages of a speculative round (jaxspec.engine.Engine._round), named in the HLO metadata while tracing so
# that a round's kernels can be charged to them: the drafter's proposal, the DDTree build inside it, the target's
# verify, the walk, the commit, the drafter's update. Kernels outside them are the round's own glue ("loop"). The
# wrappers only add jax.named_scope; the computation is unchanged.
STAGES = ("draft", "build", "verify", "accept", "commit", "draft_update")


def stage_of(op_name: str | None) -> str:
    """The round stage of an op: its innermost stage scope (the build inside the draft is "build"), "loop"
    outside them; "unmapped" without a name, "unattributed" where the profile named only the operands' part."""
    if not op_name:
        return "unmapped"
    if " (" in op_name:
        return "unattributed"
    return next((c for c in reversed(op_name.split("/")) if c in STAGES), "loop")


@contextlib.contextmanager
def named_stages(spec):
    """Name the round's stages (STAGES) for an engine whose speculator is `spec` while tracing."""
    import sys

    import jaxspec.engine as E
    home = sys.modules[type(spec).__module__]
    targets = ((E, "accept", "accept"), (E, "commit", "commit"), (M.Qwen35, "__call__", "verify"),
               (type(spec), "propose", "draft"), (type(spec), "update", "draft_update"))
    if hasattr(home, "build_tree"):      # DDTree: the tree build inside the proposal
        targets += ((home, "build_tree", "build"),)
    saved = []
    for owner, attr, name in targets:
        fn = getattr(owner, attr)
        saved.append((owner, attr, fn, isinstance(owner, type) and attr not in owner.__dict__))
        setattr(owner, attr, _in_scope(fn, name))
    try:
        yield
    finally:
        for owner, attr, fn, inherited in reversed(saved):
            if inherited:
                delattr(owner, attr)
            else:
                setattr(owner, attr, fn)


def compile_fn(fn, *args, donate=()):
    """AOT-compile fn on args; returns (compiled, {trace_s, compile_s})."""
    t = time.perf_counter()
    with named_parts():
        lowered = jax.jit(fn, donate_argnums=donate).lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return compiled, dict(trace_s=t1 - t, compile_s=t2 - t1)


# ---------------------------------------------------------------------------------------------- ceilings

# A ceiling is what the card can do: each is taken at the fastest of its timed calls (the median is kept beside
# it). On session 16's H200 runs the bf16 matmul's median moved 580 -> 722 TFLOP/s between two leases while
# its fastest call stayed at 673-735, and an 8K prefill that ran at 328 TFLOP/s both times read as 56.6% and
# 45.3% "of matmul" (bench/results/2026-12-01-h200-s16-count).

def measure_copy(gib: float, iters: int) -> dict:
    """Device-to-device bandwidth over a buffer far larger than L2, counting bytes read + written."""
    n = max(1, int(gib * 2**30) // 4)
    x = jax.jit(lambda: jax.random.normal(jax.random.key(1), (n,), jnp.float32))()
    out = dict(buffer_bytes=int(x.nbytes), bytes_per_op=2 * int(x.nbytes), variants={})
    for name, f in (("add_one", jax.jit(lambda x: x + 1.0)), ("copy", jax.jit(jnp.copy))):
        r = time_calls(lambda: f(x).block_until_ready(), 3, iters)
        r["tb_s"] = 2 * x.nbytes / (r["min_ms"] * 1e-3) / 1e12
        r["tb_s_median"] = 2 * x.nbytes / (r["median_ms"] * 1e-3) / 1e12
        out["variants"][name] = r
    out["tb_s"] = max(r["tb_s"] for r in out["variants"].values())
    # Read-only bandwidth (a reduction reads the buffer once, writes 4 bytes): weight-streaming gemms
    # read far more than they write, and on the H200 they ran above the copy rate (2026-11-29).
    f = jax.jit(jnp.sum)
    r = time_calls(lambda: f(x).block_until_ready(), 3, iters)
    r["tb_s"] = x.nbytes / (r["min_ms"] * 1e-3) / 1e12
    r["tb_s_median"] = x.nbytes / (r["median_ms"] * 1e-3) / 1e12
    out["read"] = r
    out["read_tb_s"] = r["tb_s"]
    del x
    return out


def measure_matmul(n: int, iters: int) -> dict:
    ka, kb = jax.random.split(jax.random.key(2))
    a = jax.jit(lambda: jax.random.normal(ka, (n, n), jnp.float32).astype(jnp.bfloat16))()
    b = jax.jit(lambda: jax.random.normal(kb, (n, n), jnp.float32).astype(jnp.bfloat16))()
    mm = jax.jit(lambda a, b: a @ b)
    r = time_calls(lambda: mm(a, b).block_until_ready(), 3, iters)
    r.update(n=n, dtype="bfloat16", tflop_s=2 * n**3 / (r["min_ms"] * 1e-3) / 1e12,
             tflop_s_median=2 * n**3 / (r["median_ms"] * 1e-3) / 1e12)
    return r


# ------------------------------------------------------------------------------------------------ model

def build_params(cfg: TargetConfig, seed: int = 0, how: str = "leafwise"):
    """Random weights made on the device inside jit; the graphdef comes from an abstract model.

    how='leafwise': N(0, 0.02) per leaf, one small jit per distinct shape, the key a runtime argument.
    how='model': the model's own initialisers in one jit of all 64 layers; on the H200 (2026-11-29)
    that did not finish within 9 minutes at the real shape, so it is not the default.
    """
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: M.Qwen35(cfg, rngs=nnx.Rngs(seed))))
    t = time.perf_counter()
    if how == "model":
        try:
            params = jax.jit(lambda: nnx.split(M.Qwen35(cfg, rngs=nnx.Rngs(seed)))[1])()
            jax.block_until_ready(params)
            return graphdef, params, dict(init="model", init_s=time.perf_counter() - t)
        except Exception as e:  # noqa: BLE001 - any failure here leaves the leafwise way
            log(f"model init failed ({type(e).__name__}: {str(e)[:200]}); falling back to leafwise")
    leaves, treedef = jax.tree.flatten(abstract)
    key = jax.random.key(seed)
    params = jax.tree.unflatten(treedef, [_normal(jax.random.fold_in(key, i), x.shape, jnp.dtype(x.dtype), 0.02)
                                          for i, x in enumerate(leaves)])
    jax.block_until_ready(params)
    return graphdef, params, dict(init="leafwise", init_s=time.perf_counter() - t)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _normal(key, shape, dtype, scale):
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)


def param_bytes(cfg: TargetConfig, params) -> dict:
    """Bytes and counts of the weights, by part."""
    by = dict(embed=0, lm_head=0, attn=0, gdn=0, mlp=0, norm=0)
    count = 0
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        name = jax.tree_util.keystr(path)
        part = ("embed" if "embed_tokens" in name else "lm_head" if "lm_head" in name else
                "attn" if "self_attn" in name else "gdn" if "linear_attn" in name else
                "mlp" if "'mlp'" in name or ".mlp" in name else "norm")
        by[part] += int(leaf.size) * jnp.dtype(leaf.dtype).itemsize
        count += int(leaf.size)
    total = sum(by.values())
    # A decode step gathers B rows of the embedding table; it reads all of it only when tied (lm_head).
    read = total - (0 if cfg.tie_word_embeddings else by["embed"])
    return dict(total=total, by_part=by, decode_weight_bytes=read, param_count=count,
                embed_count=int(cfg.vocab_size * cfg.hidden_size))


def state_bytes(cfg: TargetConfig, batch: int, context: int) -> dict:
    """Bytes of state a decode step must move: KV read at the context; GDN state read + written."""
    item = jnp.dtype(cfg.jnp_dtype).itemsize
    nf, nl = len(cfg.full_layers), len(cfg.linear_layers)
    kv = nf * 2 * batch * context * cfg.num_kv_heads * cfg.head_dim * item
    ssm = nl * batch * cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
    conv = nl * batch * (cfg.conv_kernel - 1) * cfg.conv_dim * item
    return dict(kv_read=kv, gdn_state_read_write=2 * (ssm + conv))


def random_state(cfg: TargetConfig, batch: int, max_len: int, length: int, seed: int = 3) -> M.State:
    """A state as if `length` tokens had been committed: random KV cache, GDN conv history and state.
    Made leaf by leaf like the weights (see build_params)."""
    abstract = jax.eval_shape(lambda: M.init_state(cfg, batch, max_len))
    key = jax.random.key(seed)
    rnd = lambda i, x, scale: _normal(jax.random.fold_in(key, i), x.shape, jnp.dtype(x.dtype), scale)
    n = len(abstract.keys)
    return M.State(length=jnp.full((batch,), length, jnp.int32),
                   keys=tuple(rnd(i, x, 1.0) for i, x in enumerate(abstract.keys)),
                   values=tuple(rnd(n + i, x, 1.0) for i, x in enumerate(abstract.values)),
                   conv=tuple(rnd(2 * n + i, x, 1.0) for i, x in enumerate(abstract.conv)),
                   ssm=tuple(rnd(1000 + i, x, 0.05) for i, x in enumerate(abstract.ssm)))


ENDLESS = 1 << 20   # max_new of timed device loops: no sequence finishes


def decoding_at(eng, state, draft):
    """A Decoding for `eng` from this target state and drafter state, batch 1, without prefill (the
    small fields replicated on the engine's mesh). `out` has 8 slots: writes past it are dropped, which
    costs the same as keeping them."""
    from jax.sharding import NamedSharding, PartitionSpec
    from jaxspec.engine import Decoding
    n = eng.spec.tree_size
    small = (jnp.ones((1,), jnp.int32), jnp.zeros((1, 8), jnp.int32), jnp.zeros((1,), jnp.int32),
             jnp.zeros((1,), bool), jax.random.key(0), jnp.zeros((1, n + 1), jnp.int32), jnp.zeros((1,), jnp.int32))
    if eng.mesh is not None:
        small = jax.device_put(small, NamedSharding(eng.mesh, PartitionSpec()))
    return Decoding(state, draft, *small)


def trace_rounds(eng, d, rounds: int, calls: int, out: Path) -> dict:
    """A jax.profiler trace of `calls` device-loop calls of `rounds` rounds each, from `d` (compiled
    already), kept as out/<engine>.xplane.pb. Analyse it with `python -m bench.profile XPLANE HLO --device 0`
    and the optimized HLO of the same run (XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text)."""
    out.mkdir(parents=True, exist_ok=True)
    state = [d]

    def call():
        state[0] = eng._run(eng.params, state[0], ENDLESS, rounds)
        return state[0]

    with profile.trace(call, calls) as xplane:
        if xplane is None:
            return dict(error="no xplane.pb written")
        dest = out / f"{eng.spec.name}_rounds.xplane.pb"
        shutil.copy(xplane, dest)
    return dict(xplane=str(dest), rounds=rounds * calls, bytes=dest.stat().st_size)


def engine_rounds(eng, state, draft, rounds: int, repeats: int = 4, queue: int = 4) -> dict:
    """ms per round inside the engine's device loop (the compiled `Engine._run` that generate uses), from
    `state` and `draft` (e.g. random_state at some committed length): no prefill. `out` has 8 slots (writes
    past it are dropped, which costs the same as keeping them) and max_new is huge, so every round runs.
    Two untimed calls first: under a mesh the second may recompile for the shardings the first returned.

    Two figures a round. `median_ms`: one call of `rounds` rounds, then a sync, so the call's fixed host work
    (arguments flattened, the program launched, the result read back) is spread over its rounds, as in a
    generate that streams every `rounds` rounds. `queued_median_ms`: `queue` calls dispatched back to back, then
    one sync, so each call's host work can overlap the previous call's loop where the runtime lets it.
    Raises if a call ran fewer rounds than asked (the state ran out of room: a larger max_len is needed)."""
    d = decoding_at(eng, state, draft)
    for _ in range(2):
        d = eng._run(eng.params, d, ENDLESS, rounds)
    jax.block_until_ready(d)

    def timed(calls):
        nonlocal d
        r0 = int(d.rounds[0])
        t = time.perf_counter()
        for _ in range(calls):
            d = eng._run(eng.params, d, ENDLESS, rounds)
        jax.block_until_ready(d)
        ran = int(d.rounds[0]) - r0
        if ran != calls * rounds:
            raise RuntimeError(f"engine_rounds: {ran} of {calls * rounds} rounds ran (the state reached its max_len "
                               f"of {d.state.max_len} slots at length {int(d.state.length[0])}); give it more slots")
        return (time.perf_counter() - t) * 1e3 / ran

    per, queued = [], []
    for _ in range(repeats):
        per.append(timed(1))
        queued.append(timed(queue))
    hist = np.asarray(d.hist).sum(0)
    return dict(median_ms=float(np.median(per)), min_ms=float(np.min(per)), rounds_per_call=rounds,
                queued_median_ms=float(np.median(queued)), queued_min_ms=float(np.min(queued)), queued_calls=queue,
                tau_random_weights=float((hist * np.arange(len(hist))).sum() / max(hist.sum(), 1)))


def make_decode_step(graphdef, cfg: TargetConfig, batch: int):
    def decode_step(params, state, token):
        model = nnx.merge(graphdef, params)
        tr = chain(batch, 1)
        logits, _, state, pending = model(token, state, tr)
        with jax.named_scope("commit"):
            state = M.commit(state, pending, tr, jnp.zeros((batch, 1), jnp.int32), jnp.ones((batch,), jnp.int32))
        return state, jnp.argmax(logits[:, 0], -1).astype(jnp.int32)[:, None]
    return decode_step


def make_decode_loop(graphdef, cfg: TargetConfig, batch: int, steps: int):
    """`steps` decode steps in one jit (a device loop, as a serving loop runs): no host work per step."""
    step = make_decode_step(graphdef, cfg, batch)

    def decode_loop(params, state, token):
        return jax.lax.fori_loop(0, steps, lambda i, c: step(params, *c), (state, token))
    return decode_loop


def make_prefill(graphdef, cfg: TargetConfig):
    def prefill(params, state, tokens):
        model = nnx.merge(graphdef, params)
        b, p = tokens.shape
        tr = chain(b, p)
        n = jnp.full((b,), p, jnp.int32)
        logits, _, state, _ = model(tokens, state, tr, logit_index=n - 1, commit_n=n)   # committed as it goes
        return state, jnp.argmax(logits, -1).astype(jnp.int32)[:, None]
    return prefill


def random_tokens(cfg: TargetConfig, batch: int, n: int, seed: int):
    return jax.jit(lambda: jax.random.randint(jax.random.key(seed), (batch, n), 0, cfg.vocab_size, jnp.int32))()


# ---------------------------------------------------------------------------------------------- profile

def profile_steps(run_step, steps: int, module: str | None, hlo_text: str, dump: Path | None, tag: str,
                  per: int | None = None, top: int = 30, stages: bool = False) -> dict:
    """Trace `steps` calls of run_step (the last one waited for inside the trace) and charge kernels to parts,
    per step, or per `per` units over the whole trace (e.g. rounds, when each call runs several); with `stages`,
    also to a round's stages ("by_stage", stage_of; a kernel XLA shares between stages is split by its share)."""
    with profile.trace(run_step, steps) as xplane:
        if xplane is None:
            return dict(error="no xplane.pb written")
        if dump is not None:
            shutil.copy(xplane, dump / f"trace_{tag}.xplane.pb")
        events, info = profile.load_events(xplane, module)
        index = profile.HloIndex(hlo_text)
        out = profile.summarize(events, index, per or steps, top=top)
        if stages:
            out["by_stage"] = profile.summarize(events, index, per or steps, top=0, classify=stage_of)["by_part"]
        out.update(info)
        return out


# ------------------------------------------------------------------------------------------- breakdown

def make_parts(graphdef, cfg: TargetConfig, batch: int):
    """Each part of a decode step alone, over all the layers that have it, on the same weights."""
    zeros, ones = jnp.zeros((batch, 1), jnp.int32), jnp.ones((batch,), jnp.int32)

    def mlp_stack(params, x):
        m = nnx.merge(graphdef, params)
        for layer in m.layers:
            x = x + layer.mlp(*layer.post_attention_layernorm.deferred(x))
        return x

    def attn_stack(params, keys, values, length, x):
        m = nnx.merge(graphdef, params)
        tr = chain(batch, 1)
        keys, values, fi = list(keys), list(values), 0
        for layer in m.layers:
            if layer.is_full:
                h, r = layer.input_layernorm.deferred(x)
                h, keys[fi], values[fi] = layer.self_attn(h, keys[fi], values[fi], length, length[:, None] + tr.depth,
                                                          tr, r)
                x, fi = x + h, fi + 1
        return x, tuple(keys), tuple(values)

    def gdn_stack(params, conv, ssm, length, x):
        m = nnx.merge(graphdef, params)
        tr = chain(batch, 1)
        pend, li = [], 0
        for layer in m.layers:
            if not layer.is_full:
                h, r = layer.input_layernorm.deferred(x)
                h, p = layer.linear_attn(h, conv[li], ssm[li], tr, r)
                x, li = x + h, li + 1
                pend.append(p)
        with jax.named_scope("commit"):
            st = M.commit(M.State(length, (), (), conv, ssm), M.Pending(tuple(pend)), tr, zeros, ones)
        return x, st.conv, st.ssm

    def head(params, x, token):
        m = nnx.merge(graphdef, params)
        return jnp.argmax(m.logits(x[:, 0]), -1).astype(jnp.int32), m.embed(token)

    return mlp_stack, attn_stack, gdn_stack, head


def run_breakdown(graphdef, cfg, params, pbytes, batch, context, max_len, warmup, iters) -> dict:
    mlp_stack, attn_stack, gdn_stack, head = make_parts(graphdef, cfg, batch)
    st = random_state(cfg, batch, max_len, context)
    x = jax.jit(lambda: jax.random.normal(jax.random.key(5), (batch, 1, cfg.hidden_size)).astype(cfg.jnp_dtype))()
    tok = random_tokens(cfg, batch, 1, 6)
    sb = state_bytes(cfg, batch, context)
    by = pbytes["by_part"]
    out = {}

    def record(name, ct, run, nbytes):
        r = time_calls(run, warmup, iters)
        r.update(ct, bytes=nbytes, tb_s=nbytes / (r["median_ms"] * 1e-3) / 1e12)
        out[name] = r
        log(f"  breakdown {name:5s} {r['median_ms']:8.3f} ms  {r['tb_s']:.2f} TB/s  ({nbytes / 1e9:.3f} GB)")

    # Per-part norms: input norms go with the mixers, post-attention norms with the MLP; their bytes are tiny.
    c, ct = compile_fn(mlp_stack, params, x)
    record("mlp", ct, lambda: c(params, x).block_until_ready(), by["mlp"])

    kv = [st.keys, st.values]

    def run_attn():
        y, kv[0], kv[1] = ca(params, kv[0], kv[1], st.length, x)
        y.block_until_ready()
    ca, ct = compile_fn(attn_stack, params, st.keys, st.values, st.length, x, donate=(1, 2))
    record("attn", ct, run_attn, by["attn"] + sb["kv_read"])

    gs = [st.conv, st.ssm]

    def run_gdn():
        y, gs[0], gs[1] = cg(params, gs[0], gs[1], st.length, x)
        y.block_until_ready()
    cg, ct = compile_fn(gdn_stack, params, st.conv, st.ssm, st.length, x, donate=(1, 2))
    record("gdn", ct, run_gdn, by["gdn"] + sb["gdn_state_read_write"])

    ch, ct = compile_fn(head, params, x, tok)
    record("head", ct, lambda: jax.block_until_ready(ch(params, x, tok)), by["lm_head"])
    out["sum_ms"] = sum(out[k]["median_ms"] for k in ("mlp", "attn", "gdn", "head"))
    out["context"] = context
    return out


# ------------------------------------------------------------------------------------------------ runs

def loop_calls(args) -> int:
    """The device loop's calls at one context: one untimed, then --loop-iters (none without --loop-steps)."""
    return 1 + args.loop_iters if args.loop_steps else 0


def decode_steps(args) -> int:
    """The most decode steps run_decode takes at one context (each commits a token): --warmup, --iters,
    --pipelined, --profile-steps and the device loop's calls."""
    return args.warmup + args.iters + args.pipelined + args.profile_steps + loop_calls(args) * args.loop_steps


def decode_max_len(args, context: int) -> int:
    """The cache slots of run_decode's state at `context`: room for its steps, in a multiple of 128."""
    return context + -(-(decode_steps(args) + 16) // 128) * 128


def run_decode(graphdef, cfg, params, pbytes, copy_tb_s, read_tb_s, args, context, dump) -> dict:
    b = args.batch
    max_len = decode_max_len(args, context)
    state = random_state(cfg, b, max_len, context)
    tok = random_tokens(cfg, b, 1, 4)
    step = make_decode_step(graphdef, cfg, b)
    compiled, ct = compile_fn(step, params, state, tok, donate=(1,))
    log(f"decode ctx={context}: compiled (trace {ct['trace_s']:.1f}s, compile {ct['compile_s']:.1f}s)")
    hold = [state, tok]
    del state

    def one():
        hold[0], hold[1] = compiled(params, hold[0], hold[1])
        return hold[1]

    def synced():
        one()
        hold[1].block_until_ready()

    r = dict(context=context, max_len=max_len, batch=b, **ct)
    r["step"] = time_calls(synced, args.warmup, args.iters)
    t = time.perf_counter()
    for _ in range(args.pipelined):
        one()
    hold[1].block_until_ready()
    r["pipelined_ms"] = (time.perf_counter() - t) * 1e3 / max(args.pipelined, 1)

    sb = state_bytes(cfg, b, context)
    nbytes = pbytes["decode_weight_bytes"] + sb["kv_read"] + sb["gdn_state_read_write"]
    ms = r["step"]["median_ms"]
    best = min(ms, r["pipelined_ms"])
    roof = nbytes / (copy_tb_s * 1e12) * 1e3
    r["bytes"] = dict(weights=pbytes["decode_weight_bytes"], **sb, total=nbytes)
    r["roofline_ms"] = roof
    r["ratio_to_roofline"] = ms / roof                # measured step / roofline: 1.0 is the floor
    r["ratio_to_roofline_pipelined"] = r["pipelined_ms"] / roof
    # The same bytes at the read-only rate (the tighter floor: a decode step mostly reads).
    r["roofline_read_ms"] = nbytes / (read_tb_s * 1e12) * 1e3
    r["ratio_to_roofline_read_pipelined"] = r["pipelined_ms"] / r["roofline_read_ms"]
    r["achieved_tb_s"] = nbytes / (best * 1e-3) / 1e12
    r["tokens_per_s"] = b * 1e3 / best
    log(f"decode ctx={context}: step median {ms:.3f} ms (p10 {r['step']['p10_ms']:.3f}, p90 {r['step']['p90_ms']:.3f}),"
        f" pipelined {r['pipelined_ms']:.3f} ms; roofline {roof:.3f} ms -> x{ms / roof:.3f}")

    r["skipped"] = []                                 # optional phases left out by --deadline-s
    if args.profile_steps and past_deadline(args):
        r["skipped"].append("profile")
    elif args.profile_steps:
        try:
            hlo = compiled.as_text()
            if dump is not None:        # every traced context's, beside its trace (bench.profile reads the pair)
                with gzip.open(dump / f"hlo_decode_{context}.txt.gz", "wt") as f:
                    f.write(hlo)
            mod = re.search(r"HloModule\s+([\w.\-]+)", hlo)
            r["profile"] = p = profile_steps(one, args.profile_steps, mod.group(1) if mod else "decode_step", hlo,
                                             dump, f"decode_{context}")
            if "by_part" in p:
                parts = ", ".join(f"{k} {v['ms_per_step']:.3f}" for k, v in p["by_part"].items())
                log(f"decode ctx={context}: profile {p['kernels_per_step']:.0f} kernels/step, busy "
                    f"{p['kernel_ms_per_step']:.3f} ms (gemms {p['gemm_ms_per_step']:.3f} ms at {p['gemm_tb_s']:.2f} TB/s),"
                    f" span {p['span_ms_per_step']:.3f} ms; by part (ms): {parts}")
        except Exception as e:  # the profile is a diagnosis; the timings above stand without it
            r["profile"] = dict(error=f"{type(e).__name__}: {e}")
            log(f"profile failed: {r['profile']['error']}")

    if args.loop_steps and past_deadline(args):
        r["skipped"].append("device_loop")
    elif args.loop_steps:
        loop, lct = compile_fn(make_decode_loop(graphdef, cfg, b, args.loop_steps), params, hold[0], hold[1],
                               donate=(1,))

        def run_loop():
            hold[0], hold[1] = loop(params, hold[0], hold[1])
            hold[1].block_until_ready()
        lt = time_calls(run_loop, 1, args.loop_iters)
        r["device_loop"] = dict(steps_per_call=args.loop_steps, **lct, call=lt,
                                step_ms=lt["median_ms"] / args.loop_steps)
        r["ratio_to_roofline_device_loop"] = r["device_loop"]["step_ms"] / roof
        log(f"decode ctx={context}: device loop of {args.loop_steps} steps: {r['device_loop']['step_ms']:.3f} ms/step"
            f" -> x{r['ratio_to_roofline_device_loop']:.3f} of roofline")
    steps_done = (args.warmup + args.iters + args.pipelined + (args.profile_steps if "profile" in r else 0)
                  + (loop_calls(args) * args.loop_steps if "device_loop" in r else 0))
    length = int(hold[0].length[0])
    r["state_length_ok"] = length == context + steps_done
    del hold
    return r


def prefill_rates(r: dict, cfg, pbytes) -> dict:
    """r (a prefill's prompt, batch and time) with tokens/s and FLOP/s: 2 x params x tokens (non-embedding params),
    as usually quoted, and the matmuls actually done (lm_head on the last token only; attention scores not
    counted)."""
    b, p, med = r["batch"], r["prompt"], r["time"]["median_ms"] * 1e-3
    body = pbytes["param_count"] - pbytes["embed_count"] - (0 if cfg.tie_word_embeddings else
                                                            cfg.vocab_size * cfg.hidden_size)
    head = cfg.vocab_size * cfg.hidden_size
    r["tokens_per_s"] = b * p / med
    r["flops_2NP"] = 2 * (pbytes["param_count"] - pbytes["embed_count"] * (0 if cfg.tie_word_embeddings else 1)) * b * p
    r["flops_matmul"] = 2 * body * b * p + 2 * head * b
    r["tflop_s_2NP"] = r["flops_2NP"] / med / 1e12
    r["tflop_s_matmul"] = r["flops_matmul"] / med / 1e12
    return r


def run_engine_prefill(graphdef, cfg, params, pbytes, args, chunk: int) -> dict:
    """The prompt through `Engine.prefill` in pieces of `chunk` tokens (jaxspec.generate's --prefill-chunk): the
    engine's own path to the first token, host loop over the pieces included. The first call compiles (each piece
    length once); the timed calls follow it."""
    from jaxspec.engine import Engine, prefill_pieces
    b, p = args.batch, args.prompt
    engine = Engine(nnx.merge(graphdef, params), prefill_chunk=chunk)
    prompts = np.asarray(random_tokens(cfg, b, p, 7)).tolist()
    max_len = p + 128
    ms = []
    for i in range(1 + args.prefill_iters):
        t = time.perf_counter()
        out = engine.prefill(prompts, max_len)
        jax.block_until_ready(out[0])
        ms.append((time.perf_counter() - t) * 1e3)
        del out
    sizes = prefill_pieces(p, chunk)       # the pieces Engine.prefill runs (the tail may split: 600 -> 512 + 128)
    r = prefill_rates(dict(prompt=p, batch=b, chunk=chunk, pieces=len(sizes), sizes=sizes, max_len=max_len,
                           first_call_s=ms[0] / 1e3, time=summarize(ms[1:])), cfg, pbytes)
    log(f"engine prefill P={p} in pieces of {chunk}: {r['time']['median_ms']:.2f} ms, {r['tokens_per_s']:.0f} tok/s, "
        f"{r['tflop_s_2NP']:.1f} TFLOP/s (2NP); first call {r['first_call_s']:.1f}s")
    return r


def run_prefill(graphdef, cfg, params, pbytes, args, dump: Path | None = None) -> dict:
    b, p = args.batch, args.prompt
    max_len = p + 128
    fresh = jax.jit(lambda: M.init_state(cfg, b, max_len))
    tokens = random_tokens(cfg, b, p, 7)
    compiled, ct = compile_fn(make_prefill(graphdef, cfg), params, fresh(), tokens, donate=(1,))
    log(f"prefill P={p}: compiled (trace {ct['trace_s']:.1f}s, compile {ct['compile_s']:.1f}s)")
    ms, ok = [], True
    for i in range(args.prefill_warmup + args.prefill_iters):
        s = jax.block_until_ready(fresh())
        t = time.perf_counter()
        s, nxt = compiled(params, s, tokens)
        nxt.block_until_ready()
        if i >= args.prefill_warmup:
            ms.append((time.perf_counter() - t) * 1e3)
        ok = ok and bool((s.length == p).all())       # every prefill's, every row's
        del s
    r = prefill_rates(dict(prompt=p, batch=b, max_len=max_len, **ct, time=summarize(ms), state_length_ok=ok),
                      cfg, pbytes)
    log(f"prefill P={p}: {r['time']['median_ms']:.2f} ms, {r['tokens_per_s']:.0f} tok/s, "
        f"{r['tflop_s_2NP']:.1f} TFLOP/s (2NP)")
    if args.profile_prefill:
        try:
            hold = [jax.block_until_ready(fresh())]        # made before the trace: only the prefill's kernels in it
            hlo = compiled.as_text()
            mod = re.search(r"HloModule\s+([\w.\-]+)", hlo)
            if dump is not None:
                with gzip.open(dump / f"hlo_prefill_{p}.txt.gz", "wt") as f:
                    f.write(hlo)
            r["profile"] = prof = profile_steps(lambda: compiled(params, hold.pop(), tokens)[1], 1,
                                                mod.group(1) if mod else None, hlo, dump, f"prefill_{p}")
            if "by_part" in prof:
                parts = ", ".join(f"{k} {v['ms_per_step']:.1f}" for k, v in prof["by_part"].items())
                log(f"prefill P={p}: profile {prof['kernels_per_step']:.0f} kernels, busy "
                    f"{prof['kernel_ms_per_step']:.1f} ms (gemms {prof['gemm_ms_per_step']:.1f} ms), span "
                    f"{prof['span_ms_per_step']:.1f} ms; by part (ms): {parts}")
        except Exception as e:  # a diagnosis: the timings above stand without it
            r["profile"] = dict(error=f"{type(e).__name__}: {e}")
            log(f"prefill profile failed: {r['profile']['error']}")
    return r


_SOURCES = ("jaxspec/model.py", "jaxspec/tree.py", "jaxspec/config.py",
            "pallas_kernels/tree_delta_rule/reference.py", "bench/harness.py")


def source_hashes() -> dict:
    """sha256 (12 hex) of the files the timed code runs: other sessions edit the tree, so a dirty flag
    alone does not say what ran."""
    import hashlib
    return {f: hashlib.sha256((REPO / f).read_bytes()).hexdigest()[:12] for f in _SOURCES if (REPO / f).exists()}


def machine_info() -> dict:
    d = jax.devices()[0]
    return dict(device_kind=d.device_kind, platform=d.platform, device_count=jax.device_count(),
                host=socket.gethostname(), python=platform.python_version(),
                xla_flags=os.environ.get("XLA_FLAGS", ""),
                mem_fraction=next((os.environ[v] for v in FRACTION_VARS if os.environ.get(v)), ""),
                jaxspec_flags=dispatch.flags())


def write_results(path: str, rows: list, **meta) -> None:
    """A kernel benchmark's JSON: the device, jax, the commit and the machine, then `meta` and the rows; written
    whole (bench.cli.write_json: its directory made, a failed write leaves no file, the previous one whole)."""
    data = dict(device=jax.devices()[0].device_kind, jax=jax.__version__, git=git_info(), machine=machine_info(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), **meta, rows=rows)
    write_json(path, data)


def versions() -> dict:
    import flax
    import jaxlib
    return dict(jax=jax.__version__, jaxlib=jaxlib.__version__, flax=flax.__version__, numpy=np.__version__)


def past_deadline(args) -> bool:
    return bool(args.deadline_s) and time.perf_counter() - _T0 > args.deadline_s


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and each optional flag's default after its help (a required one has none)."""

    def _get_help_string(self, action):
        return action.help if action.required else super()._get_help_string(action)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.harness", description=__doc__, formatter_class=_Help)
    ap.add_argument("--config", default="tiny", help="'real' (Qwen3.6-27B), 'tiny', or a path to an HF config.json")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"), help="weights' dtype")
    ap.add_argument("--batch", type=at_least(1), default=1, help="sequences per decode step and per prefill")
    ap.add_argument("--init", default="leafwise", choices=("leafwise", "model"), help="how to make the random weights")
    ap.add_argument("--contexts", default="1024,32768", help="comma-separated decode context lengths ('': no decode, "
                    "e.g. prefill and ceilings only)")
    ap.add_argument("--prompt", type=at_least(0), default=1024, help="prefill prompt length (0: no prefill)")
    ap.add_argument("--warmup", type=at_least(0), default=10, help="untimed decode steps before the timed ones")
    ap.add_argument("--iters", type=at_least(1), default=100, help="timed decode steps, synchronised each")
    ap.add_argument("--pipelined", type=at_least(1), default=50,
                    help="decode steps back to back, synchronised at the end")
    ap.add_argument("--loop-steps", type=at_least(0), default=0, help="also time this many steps inside one jit "
                    "(fori_loop), i.e. without host dispatch per step (0: no)")
    ap.add_argument("--loop-iters", type=at_least(1), default=5, help="timed calls of the device loop")
    ap.add_argument("--prefill-warmup", type=at_least(0), default=1, help="untimed prefills before the timed ones")
    ap.add_argument("--prefill-iters", type=at_least(1), default=5, help="timed prefills")
    ap.add_argument("--prefill-chunks", default="", help="comma-separated piece lengths: also time the prompt "
                    "through the engine's own prefill (Engine.prefill, generate's --prefill-chunk) in pieces of each "
                    "length, after one untimed call ('': none)")
    ap.add_argument("--copy-gib", type=at_least(0, float), default=4.0, help="copy-bandwidth buffer size (GiB, > 0)")
    ap.add_argument("--matmul-n", type=at_least(1), default=8192, help="size n of the n x n x n bf16 matmul ceiling")
    ap.add_argument("--ceiling-iters", type=at_least(1), default=20,
                    help="timed calls of each ceiling (copy, read, matmul)")
    ap.add_argument("--profile-steps", type=at_least(0), default=0,
                    help="decode steps to trace per context (0: none)")
    ap.add_argument("--profile-prefill", action="store_true", help="trace one more prefill and charge its kernels "
                    "to the model's parts (attention, GDN, MLP, ...), as --profile-steps does for decode")
    ap.add_argument("--breakdown", action="store_true", help="time attention / GDN / MLP / head alone "
                    "(at the largest context)")
    ap.add_argument("--deadline-s", type=at_least(0, float), default=0, help="skip optional phases (each context's "
                    "profile and device loop, prefill, each --prefill-chunks engine prefill, breakdown) once this many "
                    "seconds have passed, listing them in the result's 'skipped' (0: never)")
    ap.add_argument("--dump-dir", default=None, help="with --profile-steps / --profile-prefill: write each traced "
                    "call's trace and optimized HLO here (trace_decode_CTX.xplane.pb, hlo_decode_CTX.txt.gz; "
                    "trace_prefill_P..., hlo_prefill_P...)")
    ap.add_argument("--out", required=True, help="JSON result path, rewritten whole after each phase (see above: "
                    "a finished earlier result there is replaced only by a complete one)")
    ap.add_argument("--log", default=None, help="also append the progress lines to this file")
    args = dispatch.parse_args(ap, argv)
    args.contexts = parse_contexts(ap, "--contexts", args.contexts) if args.contexts.strip(", ") else []
    if args.profile_steps and not args.contexts:
        ap.error(f"--profile-steps {args.profile_steps} traces decode steps: give --contexts")
    if args.loop_steps and not args.contexts:
        ap.error(f"--loop-steps {args.loop_steps} times decode steps: give --contexts")
    if not args.copy_gib > 0:
        ap.error(f"--copy-gib: must be > 0, got {args.copy_gib}")
    if args.profile_prefill and not args.prompt:
        ap.error("--profile-prefill traces the prefill: give --prompt > 0")
    args.prefill_chunks = (parse_contexts(ap, "--prefill-chunks", args.prefill_chunks, "piece lengths")
                           if args.prefill_chunks.strip(", ") else [])
    if args.prefill_chunks and not args.prompt:
        ap.error("--prefill-chunks times the engine's prefill of the prompt: give --prompt > 0")
    if args.breakdown and not args.contexts:
        ap.error("--breakdown times the parts at the largest context: give --contexts")
    writable_file(ap, "--out", args.out)
    writable_file(ap, "--log", args.log)
    if args.dump_dir is not None:
        if not (args.profile_steps or args.profile_prefill):
            ap.error(f"--dump-dir {args.dump_dir}: it holds the traces of --profile-steps / --profile-prefill; "
                     "give one of them")
        writable_dir(ap, "--dump-dir", args.dump_dir, Path(args.dump_dir))
    try:
        _, cfg = resolve_config(args.config, args.dtype)
    except ConfigError as e:
        ap.error(f"--config: {e}")
    # A length the model's config refuses (Engine.generate would) is a setup no generation runs: refused, not timed.
    bound = cfg.max_position_embeddings
    if args.contexts:
        context_limit(ap, "--contexts", max(args.contexts), decode_steps(args) + 1,
                      "generated tokens (the first, then one per timed decode step)", bound)
    if args.prompt:
        context_limit(ap, "--prompt", args.prompt, 1, "generated token (the prefill's)", bound)
    return args


def main(argv=None) -> dict:
    global _T0
    _T0 = time.perf_counter()       # the deadline counts from this call, not from the import (tests import early)
    args = parse_args(argv)
    claim_device_memory()
    if args.log:
        _LOG[:] = [open(args.log, "a")]
    name, cfg = resolve_config(args.config, args.dtype)
    if args.contexts:
        # The weights and the longest context's decode state at once: where they cannot fit, stop before any timing
        # (was: a JAX out-of-memory traceback after the ceilings and the weights).
        ctx, max_len = max(args.contexts), decode_max_len(args, max(args.contexts))
        weights = nnx.split(nnx.eval_shape(lambda: M.Qwen35(cfg, rngs=nnx.Rngs(0))))[1]
        if problem := room_problem(weights, None, f"the weights of --config {args.config}"):
            raise SystemExit(f"error: {problem}")
        problem = room_problem((weights, jax.eval_shape(lambda: M.init_state(cfg, args.batch, max_len))), None,
                               f"the weights and a decode state of max_len {max_len} (the longest --contexts {ctx} "
                               f"and the timed steps' room, --batch {args.batch})")
        if problem:
            raise SystemExit(f"error: {problem}; time fewer or shorter --contexts values")
    dump = Path(args.dump_dir) if args.dump_dir else None
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
    staged = StagedResult(args.out)      # a finished earlier --out stays until this run completes
    res = dict(
        complete=False, harness="bench.harness", config_name=name, config=dataclasses.asdict(cfg),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **git_info(), sources=source_hashes(), machine=machine_info(), versions=versions(),
        settings={k: v for k, v in vars(args).items() if k not in ("out", "dump_dir", "log")},
        command=" ".join(sys.argv) if argv is None else "main(" + " ".join(argv) + ")",
        skipped=[])

    def save(final: bool = False):
        d = jax.devices()[0]
        try:
            ms = d.memory_stats() or {}
            res["memory"] = {k: int(v) for k, v in ms.items() if k in ("peak_bytes_in_use", "bytes_limit")}
        except Exception:  # not every backend reports memory
            pass
        res["wall_s"] = time.perf_counter() - _T0
        data = json.loads(json.dumps(res, default=str))      # (default=str: any odd value as text)
        staged.finish(data) if final else staged.save(data)

    if staged.keeps_earlier:
        log(f"{args.out} holds an earlier result, replaced only when this run completes (until then: {staged.path})")
    log(f"{name} on {res['machine']['device_kind']} ({res['machine']['platform']}), jax {jax.__version__}")
    res["copy_bandwidth"] = measure_copy(args.copy_gib, args.ceiling_iters)
    copy_tb_s = res["copy_bandwidth"]["tb_s"]
    log(f"copy bandwidth {copy_tb_s:.3f} TB/s (read + write of {res['copy_bandwidth']['buffer_bytes'] / 2**30:.2f} GiB),"
        f" read-only {res['copy_bandwidth']['read_tb_s']:.3f} TB/s")
    res["matmul"] = measure_matmul(args.matmul_n, args.ceiling_iters)
    log(f"bf16 matmul {args.matmul_n}^3: {res['matmul']['tflop_s']:.1f} TFLOP/s")
    save()

    graphdef, params, init = build_params(cfg, how=args.init)
    pbytes = param_bytes(cfg, params)
    res.update(init)
    res["params"] = pbytes
    log(f"params: {pbytes['param_count'] / 1e9:.3f} B, {pbytes['total'] / 1e9:.3f} GB "
        f"({pbytes['decode_weight_bytes'] / 1e9:.3f} GB read per decode step), {init['init']} init {init['init_s']:.1f}s")
    save()

    res["decode"] = []
    for ctx in args.contexts:
        d = run_decode(graphdef, cfg, params, pbytes, copy_tb_s, res["copy_bandwidth"]["read_tb_s"], args, ctx, dump)
        res["decode"].append(d)
        res["skipped"] += [f"{what} ctx={ctx}" for what in d["skipped"]]
        save()

    if args.prompt:
        if past_deadline(args):
            res["skipped"].append("prefill")
        else:
            res["prefill"] = run_prefill(graphdef, cfg, params, pbytes, args, dump)
            save()
    for chunk in args.prefill_chunks:
        if past_deadline(args):
            res["skipped"].append(f"engine prefill chunk={chunk}")
            continue
        res.setdefault("engine_prefill", []).append(run_engine_prefill(graphdef, cfg, params, pbytes, args, chunk))
        save()

    if args.breakdown:
        if past_deadline(args):
            res["skipped"].append("breakdown")
        else:
            ctx = max(args.contexts)
            slack = 128
            res["breakdown"] = run_breakdown(graphdef, cfg, params, pbytes, args.batch, ctx, ctx + slack,
                                             min(args.warmup, 5), max(args.iters // 2, 1))
            save()

    res["complete"] = True
    save(final=True)
    log("summary:")
    log(f"  copy {copy_tb_s:.3f} TB/s, matmul {res['matmul']['tflop_s']:.1f} TFLOP/s")
    for d in res["decode"]:
        log(f"  decode ctx={d['context']:6d}: {d['step']['median_ms']:8.3f} ms (pipelined {d['pipelined_ms']:.3f})"
            f"  roofline {d['roofline_ms']:.3f} ms  x{d['ratio_to_roofline']:.3f}  {d['achieved_tb_s']:.2f} TB/s"
            f"  {d['tokens_per_s']:.1f} tok/s"
            + (f"  device loop {d['device_loop']['step_ms']:.3f} ms" if "device_loop" in d else ""))
    if "prefill" in res:
        p = res["prefill"]
        log(f"  prefill P={p['prompt']}: {p['time']['median_ms']:.2f} ms, {p['tokens_per_s']:.0f} tok/s,"
            f" {p['tflop_s_2NP']:.1f} TFLOP/s")
    if res["skipped"]:
        log(f"  skipped (deadline): {res['skipped']}")
    log(f"wrote {args.out}")
    return res


if __name__ == "__main__":
    exit_with(main)
