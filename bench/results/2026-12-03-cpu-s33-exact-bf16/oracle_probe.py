# bf16: does greedy speculation part from AR when the drafts are the AR engine's own tokens? Oracle chains of 16
# (tests/oracle.py's OracleChain), corrupted at a random depth (`random`) or never (`full`: every round accepts all
# 16), on the 16 windows of loops_probe.py. Run under exact.py for the tiled products.
#   PYTHONPATH=.:tests python [bench/results/2026-12-03-cpu-s33-exact-bf16/exact.py] \
#       bench/results/2026-12-03-cpu-s33-exact-bf16/oracle_probe.py OUT.json
import json
import os
import sys

import jax.numpy as jnp

from convert.hf import load_target
from jaxspec import tree as trees
from jaxspec.engine import Engine, Proposal
from jaxspec.tokenizer import load_tokenizer
from oracle import OracleChain, reference


class FullChain(OracleChain):
    """OracleChain that never corrupts: the chain is the reference's next 15 tokens."""

    def propose(self, params, model, pos, pending, key, sampling):
        b, n = pending.shape[0], self.tree_size
        ref = jnp.asarray(self.ref)
        drafts = jnp.take_along_axis(ref, jnp.clip(pos[:, None] + jnp.arange(1, n), 0, ref.shape[1] - 1), 1)
        return Proposal(jnp.concatenate([pending[:, None], drafts], 1), trees.chain(b, n)), pos


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from windows import windows  # noqa: E402

t = load_target("jaxspec/demo/target", dtype="bfloat16")
tok = load_tokenizer("jaxspec/demo/target")
prompts = windows(tok)
ar = Engine(t, None, stop_tokens=())
out = {"full": [], "random": []}
for p in prompts:
    a = list(ar.generate([p], 128, max_len=300).tokens[0])
    ref = reference([p], [a], 17)
    for name, cls in (("full", FullChain), ("random", OracleChain)):
        d = list(Engine(t, cls(16, t.cfg.vocab_size, ref), stop_tokens=()).generate([p], 128, max_len=300).tokens[0])
        out[name].append(next((i for i, (x, y) in enumerate(zip(a, d)) if x != y), None))
for name in ("full", "random"):
    out[f"{name}_identical"] = sum(r is None for r in out[name])
print(json.dumps(out))
json.dump(out, open(sys.argv[1], "w"), indent=1)
