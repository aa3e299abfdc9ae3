"""Which elementwise ops did XLA fuse into each product of the AR step? (#6)

    PYTHONPATH=. python bench/next/k_hlo.py --out DIR [--layers 4]

Session 38 took each RMSNorm's row scale after the product it feeds (jaxspec/model.py `RMSNorm.deferred`): the
trace of the 27B AR step lost 129 kernels a step and 0.14 ms of small kernels, but its products' kernels
(`gemm_fusion_dot_*`) took 0.145 ms longer. If XLA fused the row scale into the products' epilogues, their kernels
carry it. This compiles the decode step at the real widths with `--layers` layers (no weights are made: the
arguments are abstract), writes the optimized HLO to DIR/decode_step.hlo.txt, and lists per product fusion the ops
other than the dot, its operands' converts and bitcasts (DIR/gemm_fusions.json).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from bench.harness import make_decode_step, resolve_config
from jaxspec import model as M

PLAIN = {"parameter", "dot", "convert", "bitcast", "ROOT", "constant", "tuple", "get-tuple-element"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4,
                    help="decoder layers, in the 27B's order (default: 3 GDN + 1 full)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _, cfg = resolve_config("real", "bfloat16")
    cfg = dataclasses.replace(cfg, layer_types=cfg.layer_types[:args.layers])
    abstract = nnx.eval_shape(lambda: M.Qwen35(cfg, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(abstract)
    state = jax.eval_shape(lambda: M.init_state(cfg, 1, 2048))
    token = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    text = jax.jit(make_decode_step(graphdef, cfg, 1)).lower(params, state, token).compile().as_text()
    (out / "decode_step.hlo.txt").write_text(text)
    fusions = {}
    for m in re.finditer(r"^(?:%)?(\S*gemm_fusion\S*)\s.*?\{\n(.*?)\n\}", text, re.S | re.M):
        ops = sorted({o for o in re.findall(r"=\s*\S+\s+([a-z\-]+)\(", m.group(2))} - PLAIN)
        fusions[m.group(1)] = ops
    (out / "gemm_fusions.json").write_text(json.dumps(fusions, indent=1) + "\n")
    for name, ops in fusions.items():
        print(f"{name:50s} {' '.join(ops) or '(dot only)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
