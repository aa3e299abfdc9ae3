import os, sys, time, glob, gzip, json, collections
import jax, jax.numpy as jnp, numpy as np
from convert.hf import load_target
from convert.drafter import load_drafter
from jaxspec.engine import Engine
from jaxspec.dflash import DFlash
method = sys.argv[1]
budget = int(sys.argv[2]) if len(sys.argv) > 2 else None
t = load_target("jaxspec/demo/target", dtype="float32")
spec = None
if method != "ar":
    spec = DFlash(load_drafter("jaxspec/demo/drafter", dtype="float32"), t.cfg, 16, budget=budget)
rng = np.random.default_rng(0)
prompt = list(map(int, rng.integers(10, 4000, 64)))
with jax.default_matmul_precision("highest"):
    eng = Engine(t, spec, stop_tokens=())
    ml = 64 + 128 + 66 + 2
    r = eng.generate([prompt], 128, max_len=ml)
    ts = []
    for i in range(3):
        r = eng.generate([prompt], 128, max_len=ml); ts.append(r.decode_s / r.hist.sum())
    print(method, budget, "ms/round", [round(x*1e3, 2) for x in ts], "tau", r.tau)
    d = f"/tmp/s32/trace-{method}-{budget}"
    jax.profiler.start_trace(d)
    r = eng.generate([prompt], 128, max_len=ml)
    jax.profiler.stop_trace()
    nr = int(r.hist.sum())
f = glob.glob(d + "/**/*.trace.json.gz", recursive=True)[0]
ev = json.load(gzip.open(f))["traceEvents"]
agg = collections.Counter(); cnt = collections.Counter()
for e in ev:
    if e.get("ph") == "X" and "dur" in e:
        agg[e["name"]] += e["dur"]; cnt[e["name"]] += 1
print("rounds", nr)
for k, v in agg.most_common(45):
    print(f"{v/nr:9.1f} us/round  n/round {cnt[k]/nr:6.2f}  {k[:110]}")
