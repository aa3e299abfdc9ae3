"""Print the summaries `bench.verify_profile --out DIR` wrote: per JSON file its kernels' device time a call and
their count, then the largest kernels.

    python bench/next/commit_summary.py DIR [TOP]
"""

import json
import pathlib
import sys


def main(argv):
    top = int(argv[1]) if len(argv) > 1 else 6
    for f in sorted(pathlib.Path(argv[0]).rglob("*.json")):
        d = json.loads(f.read_text())
        print(f"{f.relative_to(argv[0])}: kernels {d['kernel_ms_per_step']:.3f} ms/step, "
              f"{d['kernels_per_step']:.0f} kernels")
        for k in d["top_kernels"][:top]:
            print(f"  {k['ms_per_step'] * 1e3:8.1f} us x{k['count_per_step']:.0f} {k['kernel'][:40]} "
                  f"{str(k['op_name'])[:60]}")


if __name__ == "__main__":
    main(sys.argv[1:])
