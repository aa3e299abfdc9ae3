"""Session 54: time per compiled round-loop call of Engine.generate on a 64-layer toy target (width 64, AR, one
round per call), so the host's cost of each call shows: run from the tree given by PYTHONPATH."""
import json, statistics, time
import numpy as np
from flax import nnx
from jaxspec.generate import tiny_random_config
from jaxspec.engine import Engine
from jaxspec.model import Qwen35

cfg = tiny_random_config().replace(layer_types=tuple(
    "full_attention" if i % 4 == 3 else "linear_attention" for i in range(64)), dtype="float32")
model = Qwen35(cfg, rngs=nnx.Rngs(0))
eng = Engine(model)
prompt = np.random.RandomState(0).randint(0, 1000, size=8).tolist()
n = 33
eng.generate([prompt], n, rounds_per_call=1)
per_call = []
for _ in range(5):
    r = eng.generate([prompt], n, rounds_per_call=1)
    per_call.append(r.decode_s / int(r.rounds[0]))
many = []
for _ in range(5):
    r = eng.generate([prompt], n)
    many.append(r.decode_s / int(r.rounds[0]))
print(json.dumps({"leaves": len(__import__("jax").tree.leaves(eng.params)), "round_one_per_call_ms":
                  round(1e3 * statistics.median(per_call), 3), "round_all_in_one_call_ms":
                  round(1e3 * statistics.median(many), 3)}))
