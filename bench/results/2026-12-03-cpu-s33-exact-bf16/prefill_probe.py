# Do the AR engine and the DFlash engine leave the same bits after the prefill (bf16)? They run different programs:
# DFlash's also returns the target's taps for the drafter. Run under exact.py to have the tiled products.
#   PYTHONPATH=. python bench/results/2026-12-03-cpu-s33-exact-bf16/exact.py \
#       bench/results/2026-12-03-cpu-s33-exact-bf16/prefill_probe.py OUT.json
import json
import sys

import jax
import numpy as np

from convert.drafter import load_drafter
from convert.hf import load_target
from jaxspec.dflash import DFlash
from jaxspec.engine import Engine
from jaxspec.tokenizer import load_tokenizer

t = load_target("jaxspec/demo/target", dtype="bfloat16")
prompt = load_tokenizer("jaxspec/demo/target").encode(open("jaxspec/train.py").read())[:64]
ar = Engine(t, None, stop_tokens=())
df = Engine(t, DFlash(load_drafter("jaxspec/demo/drafter", dtype="bfloat16"), t.cfg, 16), stop_tokens=())
out = {}
fa, sa, _, _ = ar.prefill([prompt], 260)
fd, sd, _, _ = df.prefill([prompt], 260)
out["first_token_equal"] = bool(np.all(np.asarray(fa) == np.asarray(fd)))
for name in ("keys", "values", "conv", "ssm"):
    a, d = getattr(sa, name), getattr(sd, name)
    out[name] = [float(np.mean(np.asarray(x, np.float32) != np.asarray(y, np.float32))) for x, y in zip(a, d)]
ra = ar.generate([prompt], 64, max_len=260)
rd = df.generate([prompt], 64, max_len=260)
ta, td = list(ra.tokens[0]), list(rd.tokens[0])
out["generated_equal"] = ta == td
out["first_differing_token"] = next((i for i, (x, y) in enumerate(zip(ta, td)) if x != y), None)
print(json.dumps(out))
json.dump(out, open(sys.argv[1], "w"), indent=1)
