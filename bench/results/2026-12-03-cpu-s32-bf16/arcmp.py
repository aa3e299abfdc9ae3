import sys, os, json
import jax, numpy as np
from convert.hf import load_target
from convert.drafter import load_drafter
from jaxspec.engine import Engine
from jaxspec.dflash import DFlash
from jaxspec.tokenizer import load_tokenizer
dt, method, out = sys.argv[1], sys.argv[2], sys.argv[3]
tok = load_tokenizer("jaxspec/demo/target")
files = open("bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt").read().split()
rng = np.random.default_rng(7)
prompts = []
for f in files[:40:2][:16]:
    ids = tok.encode(open(f).read())
    s = int(rng.integers(0, max(1, len(ids) - 64)))
    prompts.append(list(map(int, ids[s:s + 64])))
t = load_target("jaxspec/demo/target", dtype=dt)
spec = None if method == "ar" else DFlash(load_drafter("jaxspec/demo/drafter", dtype=dt), t.cfg, 16, budget=None)
eng = Engine(t, spec, stop_tokens=())
with jax.default_matmul_precision("highest"):
    toks = [eng.generate([p], 128, max_len=64 + 128 + 20).tokens[0] for p in prompts]
json.dump(toks, open(out, "w"))
