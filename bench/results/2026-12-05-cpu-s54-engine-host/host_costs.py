"""Session 54: host-side costs of Engine.generate on the demo target (CPU, float32), run from a tree given by
PYTHONPATH (HEAD before the change, or after). Medians of 5 warm calls unless said."""
import json, statistics, sys, time
import numpy as np
import jax
from convert.store import load_model
from jaxspec.engine import Engine
from jaxspec.sampling import Sampling

model = load_model("jaxspec/demo/target", dtype="float32")
rs = np.random.RandomState(0)
p256, p257 = (rs.randint(0, 4096, size=n).tolist() for n in (256, 257))
out = {}

def med(f, n=5):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); r = f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts), r

greedy = Engine(model)
for name, prompt in (("prefill_256", p256), ("prefill_257", p257)):
    greedy.generate([prompt], 4, max_len=320)                       # compile
    out[name + "_s"] = statistics.median([greedy.generate([prompt], 4, max_len=320).prefill_s for _ in range(5)])
topp = Engine(model, sampling=Sampling(0.7, top_p=0.9))
topp.generate([p256[:20]], 8, seed=0)
out["top_p_prefill_s"] = statistics.median([topp.generate([p256[:20]], 8, seed=s).prefill_s for s in range(1, 6)])
ar = Engine(model)
ar.generate([p256[:20]], 8)
t = time.perf_counter(); ar.generate([p256[:20]], 10); out["new_max_new_tokens_call_s"] = time.perf_counter() - t
out["same_max_new_tokens_call_s"], _ = med(lambda: ar.generate([p256[:20]], 10))
print(json.dumps({k: round(v, 4) for k, v in out.items()}))
