"""The TP = 1 / 2 / 4 / 8 latency table (issue #9) from `bench.tp` JSONs.

    PYTHONPATH=. python -m bench.tp_table bench/results/DIR/tp*.json --out bench/results/DIR/TABLE.md

Files of the same TP degree are merged (TP = 1 is often timed as two processes on two GPUs, one per pair of
methods). Per context: each round's median ms at every TP, its ratio to TP = 1, and the tokens/s it implies
(AR: 1 token per round; DFlash and DDTree: --tau tokens per round, default 9.18, z-lab's published HumanEval
acceptance for Qwen3.5-27B + DFlash). Verify rows are wall time of back-to-back calls, comparable across TP
degrees (the JSONs' device_ms summed a multi-GPU call's kernels over its GPUs before session 13's
bench.profile.busiest). Then the all-reduce microbench per round.

Refused: inputs of different config, budget, commit, dirty flag, timed layers (--layers), dtype or JAXSPEC_* flags
(they did not time the same code), and incomplete runs (no total_s, or complete: false: interrupted, failed or past
bench.tp's deadline). The header names the commit, dirty or not, and the flags.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.cli import exit_with, writable_file
from jaxspec.files import write_atomic
from pallas_kernels import dispatch

ROOFLINE_MS = 11.9  # ms, one 27B decode step's roofline on one H200 (DESIGN.md section 5)


def load(paths):
    """({tp: merged result}, what they share) from bench.tp JSONs; refuses incomplete runs and files of another
    config, budget, commit, dirty flag, layers, dtype or JAXSPEC_* flags (a JSON without layers or dtype: the full
    model, in a dtype it did not record)."""
    by_tp = {}
    first = None
    for p in paths:
        try:
            r = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"{p}: not a readable bench.tp JSON ({e})")
        if r.get("kind") != "tp":
            raise SystemExit(f"{p}: kind {r.get('kind')!r}, expected 'tp' (a bench.tp result)")
        if "total_s" not in r or r.get("complete") is False:
            raise SystemExit(f"{p}: an incomplete bench.tp run (interrupted, failed or past its deadline; "
                             f"skipped: {r.get('skipped', [])}); rerun it")
        key = (r["config"], r["budget"], r["git"].get("commit"), r["git"].get("dirty"), r.get("layers"),
               r.get("dtype"), r["machine"].get("jaxspec_flags"))
        if first is None:
            first = (p, key)
        elif key != first[1]:
            raise SystemExit(f"{p}: (config, budget, commit, dirty, layers, dtype, JAXSPEC_* flags) {key} differs "
                             f"from {first[0]}'s {first[1]}")
        m = by_tp.setdefault(r["tp"], dict(timings={}, allreduce={}, files=[], machine=r["machine"], date=r["date"]))
        m["files"].append(Path(p).name)
        for ctx, rows in r["timings"].items():
            m["timings"].setdefault(ctx, {}).update(rows)
        m["allreduce"].update({k: v["ms_per_round"] for k, v in r["allreduce"].items()})
    if 1 not in by_tp:
        raise SystemExit("no TP = 1 file among the inputs: the ratios need it")
    return by_tp, first[1]


def table(by_tp, key, tau):
    config, budget, commit, dirty, layers, dtype, flags = key
    tps = sorted(by_tp)
    rows = ["ar_round", "verify16", f"verify{budget + 1}", "dflash_round", f"ddtree{budget}_round"]
    names = {"ar_round": "AR round", "verify16": "verify(16)", f"verify{budget + 1}": f"verify({budget + 1})",
             "dflash_round": "DFlash round", f"ddtree{budget}_round": f"DDTree({budget}) round"}
    ctxs = sorted({c for m in by_tp.values() for c in m["timings"]}, key=int)
    machines = ", ".join(f"TP = {t}: {by_tp[t]['machine'].get('device_count')}x {by_tp[t]['machine'].get('device_kind')}"
                         f" ({', '.join(by_tp[t]['files'])})" for t in tps)
    shape = f"{config} shape" + (f", {layers} layers" if layers else "") + (f", {dtype}" if dtype else "")
    commit = f"commit {commit}" + {True: " (dirty)", False: " (clean)"}.get(dirty, "")
    if flags:
        commit += ", with " + ", ".join(f"{k}={v}" for k, v in flags.items())
    out = [f"# TP = {' / '.join(map(str, tps))}, {shape}, {commit}", "",
           f"Median ms per round from `bench.tp` ({machines}); made by `bench.tp_table`.",
           f"tok/s: AR 1 token per round; DFlash / DDTree {tau} tokens per round. Roofline of one 27B decode step on "
           f"one H200: {ROOFLINE_MS} ms. Verify rows: wall time of back-to-back calls.", ""]
    head = ["", "ctx"] + [f"TP = {t} ms" for t in tps] + [f"TP{t} / TP1" for t in tps if t != 1] + \
           [f"tok/s TP = {t}" for t in tps]
    out += ["| " + " | ".join(head) + " |", "| --- | --- | " + " | ".join(["---:"] * (len(head) - 2)) + " |"]
    for ctx in ctxs:
        for row in rows:
            ms = {t: by_tp[t]["timings"].get(ctx, {}).get(row, {}).get("median_ms") for t in tps}
            if all(v is None for v in ms.values()):
                continue
            cell = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
            ratio = [cell(ms[t] / ms[1]) if ms[t] and ms[1] else "-" for t in tps if t != 1]
            per = 1 if row == "ar_round" else (None if row.startswith("verify") else tau)
            toks = [f"{per / ms[t] * 1e3:.0f}" if per and ms[t] else "-" for t in tps]
            label = f"{int(ctx) // 1024}K" if int(ctx) % 1024 == 0 else ctx
            out.append("| " + " | ".join([names[row], label] + [cell(ms[t]) for t in tps] + ratio + toks) + " |")
    ar = [(t, by_tp[t]["allreduce"]) for t in tps if t != 1 and by_tp[t]["allreduce"]]
    if ar:
        out += ["", "All-reduce microbench (the round's psums at its sizes and counts, loop cost subtracted), ms per round:"]
        out += [f"- TP = {t}: " + ", ".join(f"{k} {v:.2f}" for k, v in a.items()) for t, a in ar]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.tp_table", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="bench.tp JSON results (one or more per TP degree; TP = 1 required)")
    ap.add_argument("--tau", type=float, default=9.18, help="tokens per DFlash / DDTree round for the tok/s "
                    "columns (default: %(default)s)")
    ap.add_argument("--out", default=None, help="write the markdown here (default: stdout)")
    args = dispatch.parse_args(ap, argv)
    if not args.tau > 0:        # (nan too)
        ap.error(f"--tau: must be > 0, got {args.tau:g}")
    writable_file(ap, "--out", args.out)
    text = table(*load(args.files), args.tau)
    if args.out:
        write_atomic(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    exit_with(main)
