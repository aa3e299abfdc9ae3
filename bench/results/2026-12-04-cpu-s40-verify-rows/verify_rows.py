"""The demo target's forward over a chain of N tokens on this CPU (session 40): how a verify's cost grows with its
rows. jitted, fp32, cache of 96 slots, batch 1; three passes over N in turn, 30 timed calls each; median per N.
    PYTHONPATH=. .venv/bin/python bench/results/2026-12-04-cpu-s40-verify-rows/verify_rows.py"""
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from convert.hf import load_target
from jaxspec import model as M, tree as trees

model = load_target("jaxspec/demo/target", dtype="float32")
graph, params = nnx.split(model)
state = M.init_state(model.cfg, 1, 96)
forward = jax.jit(lambda params, state, tokens, tree: nnx.merge(graph, params)(tokens, state, tree)[0])
rows = (1, 2, 4, 9, 16, 32)
calls = {n: (jnp.asarray(np.random.RandomState(n).randint(0, model.cfg.vocab_size, (1, n)), jnp.int32),
             trees.chain(1, n)) for n in rows}
times = {n: [] for n in rows}
for n in rows:
    jax.block_until_ready(forward(params, state, *calls[n]))                   # compile
for _ in range(3):
    for n in rows:
        for _ in range(30):
            t = time.perf_counter()
            jax.block_until_ready(forward(params, state, *calls[n]))
            times[n].append(time.perf_counter() - t)
base = np.median(times[1])
for n in rows:
    print(f"N = {n:2d}: {np.median(times[n]) * 1e3:.2f} ms, {np.median(times[n]) / base:.2f}x N = 1", flush=True)
