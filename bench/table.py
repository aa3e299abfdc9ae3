"""Issue #6's results table in one command: the round phases at each context, the tree-attention kernel
at the longest prefix, and an 8K prefill, each against its goal and the roofline.

    python -m bench.table --config real --contexts 1024,32768,131072 --prefill 8192 --budget 63 --out DIR

Nine parts, each in its own process so that each starts with the GPU's memory free (the real model's weights are
51 GB; each part's JAX takes 90% of the GPU unless XLA_CLIENT_MEM_FRACTION says otherwise), each writing its JSON
into DIR before the next starts:

1. `bench.rounds --phases ar,dflash,ddtree` at every context: AR step (back to back and inside the engine's
   device loop), drafter step, verify(16) and verify(B + 1), tree build, accept + commit, DFlash and
   DDTree(B) rounds (rounds.json, rounds.log). The AR loop runs in calls of --ar-rounds rounds (default 100:
   Engine.generate runs a whole generation in one call), the DFlash and DDTree loops in calls of --rounds;
2. `pallas_kernels.tree_attention.bench` at the longest context, N = 1 and B + 1 nodes: the kernel's KV
   bytes per second against a copy measured in the same process, and its FLOP/s against part 3's matmul rate
   (many nodes over a long prefix are compute-bound) (tree_attention.json);
3. `bench.harness --contexts '' --prompt P`: the prefill of P tokens and the bf16 matmul ceiling (harness.json);
4. `pallas_kernels.verify.bench` for B + 1 rows of the real vocabulary: the verification kernel's logits bytes
   per second against a copy measured in the same process (verify.json);
5. `pallas_kernels.tree_delta_rule.bench` for a DFlash block (16 nodes) and the tree: the tree delta rule kernel's
   time per GDN layer and its bytes (state, inputs, outputs) per second against a copy (delta_rule.json);
6.-9. the other GDN kernels a round runs by default, each a device time and its bytes per second on the device
   (against part 3's copy where it ran): `pallas_kernels.gdn_decode.bench` (an AR step's one node, a layer;
   gdn_decode.json), `pallas_kernels.gdn_tree_inputs.bench` (the inputs of the rule at the same sizes as part 5, a
   layer; gdn_tree_inputs.json; the kernel at every size, where a round runs it up to 64 nodes),
   `pallas_kernels.gdn_commit.bench` (the commit's state update after a path of 16, all layers in one call;
   gdn_commit.json) and `pallas_kernels.conv_commit.bench` (the commit's conv histories after a block of 16, all
   layers in one call; conv_commit.json).

Then DIR/table.md and DIR/table.json: every row with its goal (the goals are for the real shape at 1K
context), the ratio to the roofline (weight bytes / 4.30 TB/s, the H200's measured device-to-device copy rate; 11.9 ms at
the real shape: 51.25 GB of weights) and the tokens/s the rounds imply at --tau (default 9.18: z-lab's HumanEval acceptance length for
Qwen3.5-27B + DFlash). Only parts that succeed in this run give rows: a part that fails or runs out of
--deadline-s leaves its rows "not measured" (its JSON from an earlier run in DIR is deleted before the parts start,
as is an earlier table.md / table.json) and the command exits 1; the parts already done stay in DIR. In an existing
DIR only the table's own files are replaced (the parts' JSONs and logs, table.*). Only --config tiny times the
CPU-sized kernels (a small vocabulary, one layer); 'real' or a config.json path, the real ones.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.cli import at_least, exit_with, writable_dir, write_json
from bench.harness import context_limit, parse_contexts, resolve_config
from bench.rounds import pair_configs, timed_room
from jaxspec.config import ConfigError
from jaxspec.files import write_atomic
from jaxspec.provenance import git_info
from jaxspec.sharding import claim_device_memory
from pallas_kernels import dispatch

GOALS = {  # issue #6, at 1K context on one H200
    "ar_round": ("<=", 13.5, "ms"),
    "verify_chain_vs_ar": ("<=", 1.08, "x AR step"),
    "verify_tree_vs_ar": ("<=", 1.20, "x AR step"),
    "draft": ("<=", 2.0, "ms"),
    "tree_accept_commit": ("<=", 0.5, "ms"),
    "dflash_round": ("<=", 16.5, "ms"),
    "ddtree_round": ("<=", 18.5, "ms"),
    "tree_attention_of_copy": (">=", 0.80, "of copy"),   # at a 128K prefix
    "prefill_of_matmul": (">=", 0.50, "of matmul"),
}
PARTS = ("rounds", "attention", "prefill", "verify", "delta_rule", "gdn_decode", "gdn_tree_inputs", "gdn_commit",
         "conv_commit")
GDN_PARTS = PARTS[5:]
JSONS = dict(rounds="rounds.json", attention="tree_attention.json", prefill="harness.json", verify="verify.json",
             delta_rule="delta_rule.json", gdn_decode="gdn_decode.json", gdn_tree_inputs="gdn_tree_inputs.json",
             gdn_commit="gdn_commit.json", conv_commit="conv_commit.json")
COMMIT_PATH = 16              # the commit's path: a DFlash block, or a DDTree(64) path at its deepest
GOAL_CONTEXT = 1024           # the round goals' context
ATTENTION_GOAL_PREFIX = 131072  # the tree-attention goal's prefix


def log(msg):
    print(f"[table {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_part(name: str, cmd: list[str], out: Path, timeout: float) -> dict:
    """Runs one part as `python -m ...` with its output in out/<name>.log; returns what happened."""
    log(f"{name}: {' '.join(cmd)} (at most {timeout:.0f}s)")
    t = time.perf_counter()
    with open(out / f"{name}.log", "w") as f:
        try:
            rc = subprocess.run([sys.executable, "-m", *cmd], stdout=f, stderr=subprocess.STDOUT,
                                timeout=max(timeout, 1)).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    took = time.perf_counter() - t
    log(f"{name}: rc={rc} in {took:.0f}s")
    return dict(command=["python", "-m", *cmd], rc=rc, seconds=took)


def load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def rounds_by_context(r: dict | None) -> dict:
    """{context: phases} from bench.rounds' JSON (one context: 'phases'; several: 'contexts')."""
    if not r:
        return {}
    if "contexts" in r:
        return {int(c): ph for c, ph in r["contexts"].items()}
    return {int(r["context"]): r.get("phases", {})}


def ms(ph: dict, key: str, field: str = "median_ms"):
    v = ph.get(key)
    return v[field] if isinstance(v, dict) and field in v else None


def device_ms(ph: dict, key: str):
    """The phase's device time (kernels per call, bench.profile.device_time), where measured."""
    return ms(ph, key, "device_ms")


def kernel_rows(part: dict | None) -> list[dict]:
    """A kernel bench's rows with a copy fraction: the Pallas kernel's where it ran, else every one's."""
    rows = [r for r in (part or {}).get("rows", []) if "frac_of_copy" in r]
    return [r for r in rows if r.get("impl") == "pallas_triton"] or rows


def compose(rounds: dict | None, attention: dict | None, harness: dict | None, *, budget: int, block: int,
            tau: float, real: bool, verify: dict | None = None, delta_rule: dict | None = None,
            gdn: dict | None = None) -> dict:
    """The table's rows from the parts' JSONs: [{row, context, value, unit, goal, met, vs_roofline, tok_s}]. gdn:
    the GDN kernels' parts by name (GDN_PARTS), each a JSON or None."""
    roofline = (rounds or {}).get("roofline_ms_at_4.30TB_s")
    rows = []

    def add(row, ctx, value, unit, goal_key=None, tok_s=None, time_row=False, goal_ctx=GOAL_CONTEXT):
        goal = GOALS.get(goal_key) if goal_key and ctx in (None, goal_ctx) else None
        judged = goal is not None and value is not None and real
        met = None
        if judged:
            met = value <= goal[1] if goal[0] == "<=" else value >= goal[1]
        rows.append(dict(row=row, context=ctx, value=value, unit=unit,
                         goal=f"{goal[0]} {goal[1]} {goal[2]}" if goal else None, met=met,
                         vs_roofline=value / roofline if time_row and value is not None and roofline else None,
                         tok_s=tok_s))

    for ctx, ph in sorted(rounds_by_context(rounds).items()):
        ar_step, ar_round = ms(ph, "ar_step"), ms(ph, "ar_round_device_loop")
        add("AR decode step (engine device loop)", ctx, ar_round, "ms", "ar_round",
            1e3 / ar_round if ar_round else None, time_row=True)
        add("AR decode step (back to back calls)", ctx, ar_step, "ms", time_row=True)
        queued = ms(ph, "ar_round_device_loop", "queued_median_ms")
        if queued is not None:     # the device loop's calls dispatched back to back (bench.harness.engine_rounds)
            add("AR decode step (engine device loop, calls queued)", ctx, queued, "ms", time_row=True)
        # The verify / AR ratios are judged on the verify's device time where measured: back to back, a verify
        # call's wall time also holds host work that the round hides (at a 137K-slot cache, 16.6 ms of kernels
        # took 23.9 ms a call: bench/results/2026-11-30-h200-s12-table). The AR step is device-bound either way.
        for what, key, goal in ((f"chain of {block}", f"verify_chain{block}", "verify_chain_vs_ar"),
                                (f"tree of {budget + 1}", f"verify_tree{budget + 1}", "verify_tree_vs_ar")):
            wall, dev = ms(ph, key), device_ms(ph, key)
            add(f"verify, {what}", ctx, wall, "ms", time_row=True)
            add(f"verify, {what} (device time)", ctx, dev, "ms", time_row=True)
            v = dev if dev is not None else wall
            add(f"verify, {what} ({'device time' if dev is not None else 'back to back'}) / AR step (back to back)",
                ctx, v / ar_step if v and ar_step else None, "x", goal)
        # The drafter step and tree build + accept + commit run inside the round while the host enqueues
        # them: their goals are judged on device time (kernels per call); back to back, a small phase
        # alone times the host's launches.
        add("drafter step (device time)", ctx, device_ms(ph, "draft"), "ms", "draft")
        add("drafter step (back to back calls)", ctx, ms(ph, "draft"), "ms")
        builds = ph.get("tree_build", {})
        for how, get in (("device time", device_ms), ("back to back calls", ms)):
            build, ac = get(builds, str(budget)), get(ph, f"accept_commit_tree{budget + 1}")
            add(f"tree build (B = {budget}) + accept + commit ({how})", ctx,
                build + ac if build is not None and ac is not None else None, "ms",
                "tree_accept_commit" if how == "device time" else None)
        dfl, ddt = ms(ph, "dflash_round"), ms(ph, f"ddtree{budget}_round")
        add("DFlash round", ctx, dfl, "ms", "dflash_round", tau * 1e3 / dfl if dfl else None, time_row=True)
        add(f"DDTree(B = {budget}) round", ctx, ddt, "ms", "ddtree_round", tau * 1e3 / ddt if ddt else None,
            time_row=True)

    def of_copy(part):
        """(bytes/s ceiling, its label) for a kernel part's "of copy" rows: the harness's copy (prefill part) when
        it ran, so that every such row has one ceiling; the part's own otherwise (before session 16 each part
        timed its own copy per host call, 1.9-2.7 TB/s against the harness's 3.7-3.9 in the same run)."""
        tb_s = ((harness or {}).get("copy_bandwidth") or {}).get("tb_s")
        if tb_s:
            return tb_s * 1e12, f"copy {tb_s * 1e3:.4g} GB/s"
        if "copy_bytes_per_s" not in part:       # the GDN kernels' benches time no copy of their own
            return None, None
        return part["copy_bytes_per_s"], f"{part['copy_bytes_per_s'] / 1e9:.4g} GB/s"

    if attention:
        copy, copy_label = of_copy(attention)
        kernel = [r for r in attention["rows"] if r.get("impl") == "pallas_triton" and "frac_of_copy" in r]
        shown = kernel or [r for r in attention["rows"] if "frac_of_copy" in r]
        mm = (harness or {}).get("matmul", {}).get("tflop_s")
        for r in shown:
            add(f"tree attention ({r['impl']}), N = {r['n']}, KV bytes/s of copy ({copy_label})",
                r["prefix"], r["bytes_per_s"] / copy, "of copy", "tree_attention_of_copy" if kernel else None,
                goal_ctx=ATTENTION_GOAL_PREFIX)
            if mm and "flops" in r:
                # Many nodes over a long prefix are compute-bound: the copy goal's time can ask for more FLOP/s
                # than the card's matmuls reach (N = 64 at 128K: 206 GFLOP in 296 us is 696 TFLOP/s).
                add(f"tree attention ({r['impl']}), N = {r['n']}, FLOP/s of bf16 matmul ({mm:.4g} TFLOP/s)",
                    r["prefix"], r["flop_s"] / (mm * 1e12), "of matmul")
                need = r["flops"] / (r["kv_bytes"] / (GOALS["tree_attention_of_copy"][1] * copy)) / (mm * 1e12)
                add(f"tree attention, N = {r['n']}: FLOP/s the copy goal would take, of bf16 matmul",
                    r["prefix"], need, "of matmul")
    if harness and "prefill" in harness:
        p, mm = harness["prefill"], harness["matmul"]["tflop_s"]
        add(f"prefill of {p['prompt']} tokens, 2 x params x tokens FLOP/s of bf16 matmul ({mm:.4g} TFLOP/s)",
            None, p["tflop_s_2NP"] / mm, "of matmul", "prefill_of_matmul")
        add(f"prefill of {p['prompt']} tokens", None, p["time"]["median_ms"], "ms")
    for r in kernel_rows(verify):
        what = f"verify ({r['impl']}), {r['rows']} rows, T = {r['temperature']:g}"
        copy, copy_label = of_copy(verify)
        add(f"{what}: logits bytes/s of copy ({copy_label})", None, r["bytes_per_s"] / copy, "of copy")
        add(f"{what}: time", None, r["us"], "us")
    for r in kernel_rows(delta_rule):
        what = f"tree delta rule ({r['impl']}), N = {r['n']}, per GDN layer"
        copy, copy_label = of_copy(delta_rule)
        add(f"{what}: state + inputs + outputs bytes/s of copy ({copy_label})", None, r["bytes_per_s"] / copy,
            "of copy")
        add(f"{what}: device time", None, r["device_us_per_layer"], "us")
    gdn = gdn or {}
    for name, what, moved, size, time_key in GDN_ROWS:
        part = gdn.get(name)
        rows_of = [r for r in (part or {}).get("rows", []) if "device_bytes_per_s" in r]
        for r in [r for r in rows_of if r.get("impl") == "pallas_triton"] or rows_of:
            label = f"{what} ({r['impl']}), {size(r)}"
            copy, copy_label = of_copy(part)
            if copy:
                add(f"{label}: {moved} bytes/s of copy ({copy_label})", None, r["device_bytes_per_s"] / copy,
                    "of copy")
            else:
                add(f"{label}: {moved} bytes/s on the device", None, r["device_bytes_per_s"] / 1e12, "TB/s")
            add(f"{label}: device time", None, r[time_key], "us")
    return dict(rows=rows, roofline_ms=roofline, tau=tau)


# The GDN kernels' parts: (part, op, what its bytes are, its size from a row, the row's device time field)
GDN_ROWS = (
    ("gdn_decode", "GDN decode", "state + inputs + outputs", lambda r: "1 node, per GDN layer",
     "device_us_per_layer"),
    ("gdn_tree_inputs", "GDN tree inputs", "inputs + outputs", lambda r: f"N = {r['n']}, per GDN layer",
     "device_us_per_layer"),
    ("gdn_commit", "GDN commit", "states read and written + path", lambda r: f"path of {r['path']}, all "
     f"{r['layers']} GDN layers", "device_us"),
    ("conv_commit", "GDN conv commit", "history rows read and written", lambda r: f"block of {r['n']}, all "
     f"{r['layers']} GDN layers", "device_us"),
)


def markdown(table: dict, head: str) -> str:
    def value(r):
        x, unit = r["value"], r["unit"]
        if x is None:
            return "not measured"
        if unit.startswith("of "):
            return f"{x:.1%}"
        return f"{x:.3f}" if unit == "x" else f"{x:.2f} {unit}"

    roof = table["roofline_ms"]
    intro = (f"Roofline {roof:.4g} ms (weight bytes / 4.30 TB/s)" if roof else
             "No roofline (the rounds part did not run or failed)")
    lines = [head, "", f"{intro}; tokens/s at tau = {table['tau']} for the rounds, 1 / step for AR.", "",
             "| row | context | value | goal (at 1K) | met | x roofline | tok/s |",
             "| --- | ---: | ---: | --- | --- | ---: | ---: |"]
    for r in table["rows"]:
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        ctx = "-" if r["context"] is None else str(r["context"])
        roofx = "" if r["vs_roofline"] is None else f"{r['vs_roofline']:.2f}"
        toks = "" if r["tok_s"] is None else f"{r['tok_s']:.0f}"
        lines.append(f"| {r['row']} | {ctx} | {value(r)} | {r['goal'] or ''} | {met} | {roofx} | {toks} |")
    return "\n".join(lines) + "\n"


def check_out(ap: argparse.ArgumentParser, path: str) -> None:
    """The parser's error unless --out can hold the table: a directory, new (its nearest existing parent writable)
    or existing and writable. The table replaces only its own files there (the parts' JSONs, table.*); others stay."""
    if Path(path).exists() and not Path(path).is_dir():
        ap.error(f"--out {path}: is a file; name a directory")
    writable_dir(ap, "--out", path, Path(path))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.table", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny", help="'real' (Qwen3.6-27B + z-lab drafter shape), a model directory "
                    "or config.json (its shape; the kernels at their real sizes) or 'tiny' (CPU-sized, the kernels "
                    "too; default: %(default)s)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                    help="dtype of the random weights and activations of the round phases and the prefill "
                         "(bench.rounds, bench.harness); the kernel parts time their own (default: %(default)s)")
    ap.add_argument("--contexts", default="1024,32768,131072",
                    help="committed tokens of the round phases (default: %(default)s)")
    ap.add_argument("--budget", type=at_least(1), default=64,
                    help="DDTree budget B (verify and round of B + 1 nodes; default: %(default)s)")
    ap.add_argument("--prefill", type=at_least(0), default=8192,
                    help="prompt tokens of the prefill (0: skip; default: %(default)s)")
    ap.add_argument("--attention-prefix", type=at_least(-1), default=0,
                    help="prefix of the tree-attention kernel timing (default 0: the longest context; -1: skip)")
    ap.add_argument("--k", type=at_least(1), default=20,
                    help="back-to-back calls per phase timing (bench.rounds; default: %(default)s)")
    ap.add_argument("--rounds", type=at_least(1), default=10,
                    help="rounds per device-loop call (bench.rounds; default: %(default)s)")
    ap.add_argument("--ar-rounds", type=at_least(1), default=100,
                    help="rounds per call of the AR device loop (bench.rounds; default: %(default)s)")
    ap.add_argument("--tau", type=at_least(1, float), default=9.18,
                    help="acceptance length (tokens per round, >= 1) for the tokens/s column (default: %(default)s)")
    ap.add_argument("--parts", default=",".join(PARTS),
                    help="which parts to run (comma-separated; default: all, %(default)s)")
    ap.add_argument("--deadline-s", type=at_least(0, float), default=0, help="stop starting parts after this many "
                    "seconds, and cut the running one there (default 0: no limit)")
    ap.add_argument("--out", required=True,
                    help="directory for the parts' JSONs and logs, table.md, table.json: new or existing (the parts "
                         "run now replace their own files there, other files stay; the table shows only this run's)")
    args = dispatch.parse_args(ap, argv)
    claim_device_memory()        # the parts inherit it: each takes 90% of the GPU, not JAX's 75%
    parts = {p for p in args.parts.split(",") if p}
    if not parts:
        ap.error(f"--parts {args.parts!r}: names no part; choose from {','.join(PARTS)}")
    if parts - set(PARTS):
        ap.error(f"--parts: unknown {sorted(parts - set(PARTS))}; choose from {','.join(PARTS)}")
    contexts = parse_contexts(ap, "--contexts", args.contexts)
    prefix = max(contexts) if args.attention_prefix == 0 else args.attention_prefix
    skips = {"attention": f"--attention-prefix {args.attention_prefix}" if prefix < 0 else None,
             "prefill": f"--prefill {args.prefill}" if args.prefill <= 0 else None}
    if not parts - {name for name, flag in skips.items() if flag}:     # was: an empty table, exit 0
        ap.error(f"--parts {args.parts!r}: no part left to run ("
                 + ", ".join(f"{flag} skips {name}" for name, flag in skips.items() if flag and name in parts) + ")")
    try:
        _, target = resolve_config(args.config, args.dtype)      # the config every part takes ('demo' is not one)
        drafter = pair_configs(args.config, args.dtype)[1]
    except ConfigError as e:
        ap.error(f"--config {args.config!r}: {e}")
    # What the parts would refuse after minutes of others (bench.rounds' --context and bench.harness' --prompt past
    # the model's context limit), refused before any part starts.
    if "rounds" in parts:
        after = 2 + max(timed_room({"ar", "dflash", "ddtree"}, args.k, args.rounds, args.ar_rounds,
                                   drafter.block_size, [args.budget], []).values())
        context_limit(ap, "--contexts", max(contexts), after, "slots bench.rounds' timed calls take past it",
                      target.max_position_embeddings)
    if "prefill" in parts and args.prefill > 0:
        context_limit(ap, "--prefill", args.prefill, 1, "generated token (the prefill's)",
                      target.max_position_embeddings)
    check_out(ap, args.out)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # An earlier run's JSON is never read as this run's, and its table never sits beside this run's parts (were this
    # run to stop before its own table is written).
    for name in [JSONS[p] for p in parts] + ["table.md", "table.json"]:
        (out / name).unlink(missing_ok=True)
    t0 = time.perf_counter()
    left = lambda: (args.deadline_s - (time.perf_counter() - t0)) if args.deadline_s else 1e9
    ran = {}

    def part(name, cmd):
        if name not in parts or skips.get(name):
            return
        if left() <= 1:
            ran[name] = dict(rc="past the deadline, not started")
            log(f"{name}: past the deadline, not started")
            return
        ran[name] = run_part(name, cmd, out, left())

    part("rounds", ["bench.rounds", "--config", args.config, "--dtype", args.dtype, "--context", args.contexts,
                    "--phases", "ar,dflash,ddtree", "--budgets", str(args.budget), "--round-budget", str(args.budget),
                    "--k", str(args.k), "--rounds", str(args.rounds), "--ar-rounds", str(args.ar_rounds),
                    "--out", str(out / JSONS["rounds"])])
    on_gpu = _default_backend() == "gpu"
    small = args.config == "tiny"             # a CPU-sized run: a small vocabulary, one layer, the jnp ops
    part("attention", ["pallas_kernels.tree_attention.bench", "--prefixes", str(prefix),
                       "--sizes", f"1,{args.budget + 1}", "--json", str(out / JSONS["attention"])]
         + (["--no-reference"] if on_gpu else []))
    part("prefill", ["bench.harness", "--config", args.config, "--dtype", args.dtype, "--contexts", "",
                     "--prompt", str(args.prefill), "--prefill-iters", "3", "--ceiling-iters", "10",
                     "--out", str(out / JSONS["prefill"])] + (["--copy-gib", "0.01", "--matmul-n", "256"] if small
                                                               else []))
    part("verify", ["pallas_kernels.verify.bench", "--rows", str(args.budget + 1), "--json", str(out / JSONS["verify"])]
         + (["--impls", "pallas_triton"] if on_gpu else []) + (["--vocab", "4096", "--iters", "3"] if small else []))
    # The tree delta rule and its inputs at a DFlash block and at the tree (one size where they are the same).
    sizes = ",".join(str(n) for n in sorted({16, args.budget + 1}))
    cpu_sized = small and not on_gpu
    part("delta_rule", ["pallas_kernels.tree_delta_rule.bench", "--sizes", sizes,
                        "--json", str(out / JSONS["delta_rule"])] + (["--impls", "pallas_triton"] if on_gpu else [])
         + (["--layers", "1", "--iters", "2", "--impls", "xla"] if cpu_sized else []))
    part("gdn_decode", ["pallas_kernels.gdn_decode.bench", "--json", str(out / JSONS["gdn_decode"])]
         + (["--layers", "1", "--iters", "2"] if cpu_sized else []))
    part("gdn_tree_inputs", ["pallas_kernels.gdn_tree_inputs.bench", "--sizes", sizes,
                             "--json", str(out / JSONS["gdn_tree_inputs"])]
         + (["--layers", "1", "--iters", "2"] if cpu_sized else []))
    part("gdn_commit", ["pallas_kernels.gdn_commit.bench", "--paths", str(COMMIT_PATH),
                        "--json", str(out / JSONS["gdn_commit"])] + (["--iters", "2"] if cpu_sized else []))
    part("conv_commit", ["pallas_kernels.conv_commit.bench", "--json", str(out / JSONS["conv_commit"])]
         + (["--iters", "2"] if cpu_sized else []))

    # Only what succeeded in this run; rounds that did not: their rows at each context, not measured.
    got = {name: load(out / JSONS[name]) if ran.get(name, {}).get("rc") == 0 else None for name in PARTS}
    rounds = got["rounds"] or ({"contexts": {str(c): {} for c in contexts}} if "rounds" in ran else None)
    block = rounds.get("block_size", 16) if rounds else 16
    table = compose(rounds, got["attention"], got["prefill"], budget=args.budget, block=block, tau=args.tau,
                    real=args.config == "real", verify=got["verify"], delta_rule=got["delta_rule"],
                    gdn={name: got[name] for name in GDN_PARTS})
    meta = next((p for p in got.values() if p and p.get("machine")), {})    # the first part that ran records them
    # bench.harness (the prefill part) writes commit and dirty at its top level; with no part, this checkout's (the
    # parts run from it, in this environment)
    git = meta.get("git") or {k: meta[k] for k in ("commit", "dirty", "source") if k in meta} or git_info()
    machine = meta.get("machine") or {}
    flags = dispatch.flags()                         # the parts inherit this environment
    table.update(parts=ran, config=args.config, dtype=args.dtype, contexts=contexts, git=git, machine=machine,
                 flags=flags, date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    dirty = {True: " (dirty)", False: " (clean)"}.get(git.get("dirty"), "")
    head = (f"# Issue #6 table: {args.config} shape, {args.dtype}, random weights\n\n"
            f"Commit {git.get('commit', 'unknown')}{dirty}, {machine.get('device_kind', '?')}, {table['date']}; "
            f"`python -m bench.table {' '.join(argv if argv is not None else sys.argv[1:])}`; "
            + (f"with {', '.join(f'{k}={v}' for k, v in flags.items())}." if flags else
               "no JAXSPEC_* flags (every op on its default implementation)."))
    write_json(out / "table.json", table)
    md = markdown(table, head)
    write_atomic(out / "table.md", md)
    log(f"wrote {out / 'table.md'}")
    print(md)
    failed = [n for n, r in ran.items() if r.get("rc") != 0]
    if failed:
        log(f"parts not completed: {failed} (their logs are in {out})")
    return 1 if failed else 0


def _default_backend() -> str:
    """The backend the parts will run on, without initialising one in this process (the parts need the GPU)."""
    plat = os.environ.get("JAX_PLATFORMS", "")
    if plat:
        return "gpu" if plat.split(",")[0] in ("cuda", "gpu", "rocm") else plat.split(",")[0]
    import importlib.util
    return "gpu" if importlib.util.find_spec("jax_cuda13_plugin") or importlib.util.find_spec("jax_cuda12_plugin") else "cpu"


if __name__ == "__main__":
    exit_with(main)
