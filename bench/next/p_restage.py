"""Re-charge a `bench.rounds --trace-rounds` phase's kernels to the round's stages, from its JSON and the loop's HLO,
with the stage shares of kernels XLA shares between stages (session 45's first trace charged each kernel wholly to
one op_name's stage, and kept only its top 60 kernels: this reads those 60).

    python bench/next/p_restage.py ROUNDS_JSON PHASE HLO_GZ [--steps 20]
"""

from __future__ import annotations

import argparse
import gzip
import json

from bench import profile
from bench.harness import stage_of


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rounds_json")
    ap.add_argument("phase", help="e.g. dflash_trace")
    ap.add_argument("hlo")
    ap.add_argument("--steps", type=int, default=20, help="rounds in the trace (2 calls x --rounds)")
    a = ap.parse_args(argv)
    d = json.load(open(a.rounds_json))["phases"][a.phase]
    rows = d.get("kernels") or d["top_kernels"]
    hlo = profile.HloIndex(gzip.open(a.hlo, "rt").read())
    events = []
    for r in rows:
        n = int(round(r["count_per_step"] * a.steps))
        events += [(0, r["ms_per_step"] * a.steps * 1e6 / max(n, 1), r["kernel"], "")] * n
    s = profile.summarize(events, hlo, a.steps, top=0, classify=stage_of)
    print(f"{len(rows)} kernels read: {sum(e[1] for e in events) / a.steps / 1e6:.3f} of "
          f"{d['kernel_ms_per_step']:.3f} ms of kernels a round (span {d['span_ms_per_step']:.3f})")
    print(f"{'stage':14s} {'ms':>7s} {'kernels':>8s} {'gemm ms':>8s}")
    for k, v in s["by_part"].items():
        print(f"{k:14s} {v['ms_per_step']:7.3f} {v['kernels_per_step']:8.1f} {v['gemm_ms']:8.3f}")


if __name__ == "__main__":
    main()
