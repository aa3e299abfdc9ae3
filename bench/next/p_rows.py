"""Does a row of an M-row product get the same bits as the 1-row product of that row, per matmul precision? (#6, #8)

    PYTHONPATH=. python bench/next/p_rows.py --out F.json [--rows 16 64] [--precisions highest tensorfloat32 ...]

A greedy speculative round is token-identical to AR only if the target's verify (M rows) computes each row as AR's
step (1 row) does. In fp32 at `highest` that holds for the demo pair on the H200 (sessions 31-35: identical on every
prompt). Session 34 ran `eval --matmul-precision BF16_BF16_F32_X6` (six bf16 passes, ~0.18 ms off a DFlash round):
X6's AR parted from fp32 AR on 5 of 16 prompts while X6's DFlash kept fp32 AR's tokens, which points at the 1-row
products. This script asks that directly, for every 2-D weight shape of the demo target (its own weights, random
fp32 rows of unit scale), at each precision:
  - `rows_differ`: rows i of the M-row product that differ in any bit from the 1-row product of x[i];
  - `padded_differ`: the same, with x[i] padded by zero rows to M rows before the product (the fix it would point
    to: AR runs its row as a verify-sized tile);
  - `max_rel_err`: against a float64 product on the host.
Predicted (session 35's plan): `highest` 0 rows differ; X3 / X6 / tensorfloat32 rows differ (another kernel for M = 1)
and 0 padded rows differ. A product alone in a jit may not be what the model's fused program does: a yes here must
be checked in the engine's loops (`eval --matmul-precision`).
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.generate import demo_dir
from jaxspec.provenance import git_info


def weight_shapes(target_dir) -> dict[tuple[int, int], tuple[str, np.ndarray]]:
    """The distinct (in, out) shapes of the checkpoint's 2-D weights, each with one weight of that shape (in x out)."""
    from safetensors.numpy import load_file
    seen = {}
    for f in sorted(glob.glob(f"{target_dir}/*.safetensors")):
        for name, w in load_file(f).items():
            if w.ndim == 2 and min(w.shape) > 1 and w.shape[::-1] not in seen:
                seen[w.shape[::-1]] = (name, np.ascontiguousarray(w.T.astype(np.float32)))
    if not seen:
        raise SystemExit(f"p_rows: no 2-D weights in {target_dir}/*.safetensors")
    return seen


def compare(x: np.ndarray, w: np.ndarray, precision: str) -> dict:
    m = x.shape[0]
    with jax.default_matmul_precision(precision):
        dot = jax.jit(lambda a, b: jnp.dot(a, b))
        wd = jnp.asarray(w)
        full = np.asarray(dot(jnp.asarray(x), wd))
        single = np.stack([np.asarray(dot(jnp.asarray(x[i:i + 1]), wd))[0] for i in range(m)])
        pad = np.zeros_like(x)
        padded = []
        for i in range(m):
            pad[:] = 0
            pad[0] = x[i]
            padded.append(np.asarray(dot(jnp.asarray(pad), wd))[0])
        padded = np.stack(padded)
    ref = x.astype(np.float64) @ w.astype(np.float64)
    scale = np.abs(ref).max()
    return {"rows_differ": int((single != full).any(axis=1).sum()),
            "padded_differ": int((padded != full).any(axis=1).sum()),
            "max_rel_err": float(np.abs(full - ref).max() / scale),
            "max_rel_err_1row": float(np.abs(single - ref).max() / scale)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="results JSON")
    p.add_argument("--rows", type=int, nargs="+", default=[16, 64], help="M, the verify's rows (default: 16 64)")
    p.add_argument("--precisions", nargs="+",
                   default=["highest", "tensorfloat32", "BF16_BF16_F32_X3", "BF16_BF16_F32_X6"])
    p.add_argument("--target", default=None, help="a target checkpoint (default: the demo pair's)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    shapes = weight_shapes(args.target or demo_dir() / "target")
    rng = np.random.default_rng(args.seed)
    results = {"what": "row bits of M-row products against 1-row products", **git_info(),
               "device": str(jax.devices()[0].device_kind), "backend": jax.default_backend(),
               "jax": jax.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cases": []}
    for precision in args.precisions:
        for m in args.rows:
            for (k, n), (name, w) in shapes.items():
                x = rng.standard_normal((m, k)).astype(np.float32)
                try:
                    r = compare(x, w, precision)
                except Exception as e:     # a preset the backend refuses is a result, not a crash
                    r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
                results["cases"].append({"precision": precision, "rows": m, "k": k, "n": n, "weight": name, **r})
                print(f"{precision:18s} M={m:3d} {k:5d}x{n:<6d} " + (r.get("error") or
                      f"rows differ {r['rows_differ']:3d}/{m}, padded {r['padded_differ']:3d}/{m}, "
                      f"rel err {r['max_rel_err']:.1e} (1-row {r['max_rel_err_1row']:.1e})"), flush=True)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
