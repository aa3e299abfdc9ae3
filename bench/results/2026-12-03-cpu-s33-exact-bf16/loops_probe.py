# The AR engine against the DFlash engine, bf16, greedy, 128 new tokens, on 16 64-token windows of this repository's
# jaxspec/*.py files: which prompts part, and at which token. Run as is (the engine) or under exact.py.
#   PYTHONPATH=. python [bench/results/2026-12-03-cpu-s33-exact-bf16/exact.py] \
#       bench/results/2026-12-03-cpu-s33-exact-bf16/loops_probe.py OUT.json
import json
import os
import sys

from convert.drafter import load_drafter
from convert.hf import load_target
from jaxspec.dflash import DFlash
from jaxspec.engine import Engine
from jaxspec.tokenizer import load_tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from windows import windows  # noqa: E402

t = load_target("jaxspec/demo/target", dtype="bfloat16")
tok = load_tokenizer("jaxspec/demo/target")
prompts = windows(tok)
ar = Engine(t, None, stop_tokens=())
df = Engine(t, DFlash(load_drafter("jaxspec/demo/drafter", dtype="bfloat16"), t.cfg, 16), stop_tokens=())
rows = []
for p in prompts:
    a = list(ar.generate([p], 128, max_len=260).tokens[0])
    d = list(df.generate([p], 128, max_len=260).tokens[0])
    rows.append(next((i for i, (x, y) in enumerate(zip(a, d)) if x != y), None))
out = {"first_differing_token": rows, "identical": sum(r is None for r in rows), "prompts": len(rows)}
print(json.dumps(out))
json.dump(out, open(sys.argv[1], "w"), indent=1)
