"""Where an AR step and a speculative round of the demo pair spend their time, per dtype (next GPU session, #8).

    PYTHONPATH=. python bench/next/p_rounds.py --out DIR [--dtypes float32 bfloat16] [--methods ar dflash ddtree64]
                                               [--precision BF16_BF16_F32_X6] [--draft-dtype bfloat16]

Session 33 (bench/results/2026-12-03-h200-s33/) measured on the H200 a DFlash round of 1.111 ms in fp32 and 0.722 ms
in bf16, where AR went only 0.351 -> 0.300 ms: the fp32 round spends ~0.4 ms in something bf16 does much faster.
Predicted: the difference sits in the 16- and 17-row products (full fp32 at `highest` precision, no TF32), spread over
the ~60 products of the target's verify and the drafter, not in one op.
Session 34 ran it (bench/results/2026-12-03-h200-s34/prof/): three product fusions, each once per layer of the target
and the drafter (14-15 calls a round), took 316 us of the fp32 DFlash round; in bf16 two of them took 85 us and the
third was under the list's 37 us: held, most of the gap is the products (and ~0.1 ms is the tree attention kernel).
--precision then times fp32 products done another way (e.g. as bf16 passes on the tensor cores); --draft-dtype
bfloat16 puts the drafter alone in bf16 (the output stays the fp32 target's).
For each dtype and method: the compiled loop on one random 64-token prompt (128 new tokens) is timed three times,
then traced once with jax.profiler; DIR/<method>-<dtype>[-<precision>][-draft<dtype>].txt lists the trace's events by
total time per round, the device's (the kernels) apart from the host's (launches, Python). On the CPU it runs too (a
dry run of the script); there the events are XLA's thunks.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys
import tempfile
import time

import jax
import numpy as np

from convert.drafter import load_drafter
from convert.hf import load_target
from jaxspec.dflash import DFlash
from jaxspec.engine import Engine
from jaxspec.generate import demo_dir


def speculator(method: str, target, dtype: str):
    """None for AR; DFlash for `dflash`; DDTree at budget B for `ddtreeB`; the drafter in `dtype`."""
    if method == "ar":
        return None
    budget = None if method == "dflash" else int(method.removeprefix("ddtree"))
    return DFlash(load_drafter(str(demo_dir() / "drafter"), dtype=dtype), target.cfg, 16, budget=budget)


def events_per_round(trace_dir: str, rounds: int, top: int) -> list[str]:
    """The trace's events by total time per round, the device's (kernels, on the GPU) apart from the host's."""
    files = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not files:
        raise SystemExit(f"no *.trace.json.gz under {trace_dir}: the profiler wrote nothing")
    events = json.load(gzip.open(files[0]))["traceEvents"]
    process = {e["pid"]: e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "process_name" and "name" in e.get("args", {})}
    total = {"device": collections.Counter(), "host": collections.Counter()}
    count = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            side = "device" if "/device:" in process.get(e.get("pid"), "") else "host"
            total[side][e["name"]] += e["dur"]
            count[side, e["name"]] += 1
    lines = []
    for side in ("device", "host"):
        if not total[side]:
            continue
        lines.append(f"{side}: {sum(total[side].values()) / rounds:.1f} us/round in {len(total[side])} kinds of event"
                     + (" (the kernels' durations summed)" if side == "device" else " (nested events counted each)"))
        lines += [f"{us / rounds:9.1f} us/round  n/round {count[side, name] / rounds:6.2f}  {name[:120]}"
                  for name, us in total[side].most_common(top)]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for <method>-<dtype>.txt")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--methods", nargs="+", default=["ar", "dflash", "ddtree64"],
                   help="ar, dflash, ddtreeB (DDTree at budget B)")
    p.add_argument("--new", type=int, default=128, help="tokens generated per call (default 128)")
    p.add_argument("--top", type=int, default=40, help="events listed per side (device, host) and file (default 40)")
    p.add_argument("--draft-dtype", default=None, choices=["float32", "bfloat16"],
                   help="the drafter's dtype (default: the target's); the output file names then end in -draft<dtype>")
    p.add_argument("--precision", default=None,
                   help="jax.default_matmul_precision for fp32 (default: highest); "
                        "e.g. BF16_BF16_F32_X6, tensorfloat32")
    args = p.parse_args(argv)
    for m in args.methods:
        if m not in ("ar", "dflash") and not (m.startswith("ddtree") and m[6:].isdigit()):
            p.error(f"--methods {m}: expected ar, dflash or ddtreeB with B a number")
    os.makedirs(args.out, exist_ok=True)
    prompt = [int(i) for i in np.random.default_rng(0).integers(10, 4000, 64)]
    tree = max([16] + [int(m[6:]) + 1 for m in args.methods if m.startswith("ddtree")])   # nodes a round verifies
    max_len = len(prompt) + args.new + tree + 2
    for dtype in args.dtypes:
        target = load_target(str(demo_dir() / "target"), dtype=dtype)
        for method in args.methods:
            precision = (args.precision or "highest") if dtype == "float32" else "default"
            with jax.default_matmul_precision(precision):
                engine = Engine(target, speculator(method, target, args.draft_dtype or dtype), stop_tokens=())
                engine.generate([prompt], args.new, max_len=max_len)              # compile
                ms = []
                for _ in range(3):
                    r = engine.generate([prompt], args.new, max_len=max_len)
                    ms.append(1e3 * r.decode_s / r.hist.sum())
                trace = tempfile.mkdtemp(prefix=f"p_rounds-{method}-{dtype}-")
                jax.profiler.start_trace(trace)
                r = engine.generate([prompt], args.new, max_len=max_len)
                jax.profiler.stop_trace()
            rounds = int(r.hist.sum())
            ms = [round(float(x), 3) for x in ms]
            drafted = f", drafter {args.draft_dtype}" if args.draft_dtype and method != "ar" else ""
            head = (f"{method} {dtype} ({precision} products{drafted}) on {jax.devices()[0].device_kind}: "
                    f"ms/round {ms}, tau {r.tau:.2f}, "
                    f"traced rounds {rounds}, {time.strftime('%Y-%m-%d %H:%M:%S')}")
            lines = [head] + events_per_round(trace, rounds, args.top)
            name = f"{method}-{dtype}" + (f"-{precision}" if args.precision and dtype == "float32" else "")
            if args.draft_dtype and method != "ar":
                name += f"-draft{args.draft_dtype}"
            with open(os.path.join(args.out, f"{name}.txt"), "w") as f:
                f.write("\n".join(lines) + "\n")
            print(head, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
