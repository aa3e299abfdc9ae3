"""Profile one verify forward of a tree (or chain) at any shape and charge its kernels to the model's
parts (attention, GDN, MLP, ...), as `bench.harness --profile-steps` does for the AR step; with
--commit, the accept + commit that follows it instead (greedy choice, the walk, the KV moves and the
GDN state rebuild of bench.rounds' accept_commit phase). Either way the decoding state is donated and threaded from
call to call, as in the engine's round loop (until session 77 the verify's was not: its KV caches were copied whole
first, 32 copies in every profiled verify).

    python -m bench.verify_profile --config real --nodes 65 --tree --out DIR [--commit]

The summary (with the commit, the machine and the date) goes to DIR/<phase>-<tree|chain><N>.json with --out, else
to stdout, whole.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

from bench import harness as H
from bench.cli import at_least, exit_with, writable_file, write_json
from bench.rounds import random_params
from jaxspec import model as M
from jaxspec import tree as trees
from jaxspec.config import ConfigError
from jaxspec.ddtree import build_tree
from jaxspec.engine import accept
from jaxspec.sampling import Sampling, choose
from pallas_kernels import dispatch


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.verify_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="tiny", help="'real' (Qwen3.6-27B), 'tiny', or a path to an HF config.json")
    ap.add_argument("--context", type=at_least(0), default=1024, help="committed tokens before the verified nodes")
    ap.add_argument("--nodes", type=at_least(1), default=65, help="nodes verified (tree or chain size)")
    ap.add_argument("--tree", action="store_true", help="a DDTree-shaped tree (default: a chain)")
    ap.add_argument("--steps", type=at_least(1), default=2, help="calls traced (the summary is per call)")
    ap.add_argument("--commit", action="store_true", help="profile accept + commit after the verify, not the verify")
    ap.add_argument("--out", default=None, help="directory for the summary JSON (default: print it)")
    ap.add_argument("--hlo", action="store_true", help="also write the optimized HLO (gzipped) to --out, to read "
                    "what a fusion in the summary computes")
    args = dispatch.parse_args(ap, argv)
    if args.hlo and not args.out:
        ap.error("--hlo needs --out")
    n = args.nodes
    name = f"{'commit' if args.commit else 'verify'}-{'tree' if args.tree else 'chain'}{n}"
    if args.out is not None:
        if Path(args.out).exists() and not Path(args.out).is_dir():
            ap.error(f"--out {args.out}: not a directory")
        writable_file(ap, "--out", str(Path(args.out) / f"{name}.json"))
    try:
        _, cfg = H.resolve_config(args.config, "bfloat16")
    except ConfigError as e:
        ap.error(f"--config: {e}")
    model = random_params(lambda: M.Qwen35(cfg, rngs=nnx.Rngs(0)), 0)
    gd, tp = nnx.split(model)
    if args.tree:
        logp = jax.nn.log_softmax(jax.random.normal(jax.random.key(1), (1, 15, cfg.vocab_size)), -1)
        t = build_tree(logp, jnp.ones((1,), jnp.int32), n - 1)
        toks, tr = t.tokens, t.tree
    else:
        toks, tr = jnp.ones((1, n), jnp.int32), trees.chain(1, n)
    st = H.random_state(cfg, 1, args.context + 2 * n + 64, args.context)

    def verify(tp, toks, st, tr):
        logits, taps, st, pend = nnx.merge(gd, tp)(toks, st, tr)
        return logits, pend, st

    if args.commit:
        logits, pend, _ = jax.jit(verify)(tp, toks, st, tr)

        def accept_commit(st, pend, tr, toks, logits):
            path, n, bonus = accept(tr, toks, choose(None, logits, Sampling()))
            return M.commit(st, pend, tr, path, n), bonus

        # The state is donated and threaded from call to call, as in the engine's round loop: an undonated one
        # is first copied whole (the KV caches: 32 copies, ~0.1 ms at 1K on an H100, bench/results/2026-12-07-h100-s74).
        compiled, ct = H.compile_fn(accept_commit, st, pend, tr, toks, logits, donate=(0,))
        held = [st]

        def run_step():
            held[0], bonus = compiled(held[0], pend, tr, toks, logits)
            return bonus
        tag = "accept_commit"
    else:
        # Donated and threaded too: an undonated state's KV caches are first copied whole (session 77 on an H100:
        # 32 copies, 0.08 / 0.10 ms of verify(16) / verify(64) at 1K), which the engine's round loop never does.
        compiled, ct = H.compile_fn(verify, tp, toks, st, tr, donate=(2,))
        held = [st]

        def run_step():
            logits, _, held[0] = compiled(tp, toks, held[0], tr)
            return logits
        tag = "verify"
    hlo = compiled.as_text()
    mod = re.search(r"HloModule\s+([\w.\-]+)", hlo)
    res = H.profile_steps(run_step, args.steps, mod.group(1) if mod else tag, hlo, None, tag)
    res.update(config=args.config, phase=tag, nodes=n, tree=args.tree, context=args.context, compile=ct,
               git=H.git_info(), machine=H.machine_info(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    res = json.loads(json.dumps(res, default=str))
    print(json.dumps(res, indent=1))
    if args.out:
        out = Path(args.out)
        write_json(out / f"{name}.json", res)
        if args.hlo:
            with gzip.open(out / f"{name}.hlo.txt.gz", "wt") as f:
                f.write(hlo)
        print(f"wrote {out / f'{name}.json'}")
    return res


if __name__ == "__main__":
    exit_with(main)
