# One window where speculation parts from AR at token 21 (loops_probe.py's 16th, jaxspec/tokenizer.py's): its prompt
# and the AR engine's first 16 x CHAINS tokens, through the target in standalone jits (not the engine's loops), bf16:
# one-token steps with a commit after each, against CHAINS chains of 16 with a commit after each (as full oracle
# rounds run). Per row: do the logits and each layer's output agree bit for bit? Run under exact.py for the tiles.
#   PYTHONPATH=. python [bench/results/2026-12-03-cpu-s33-exact-bf16/exact.py] \
#       bench/results/2026-12-03-cpu-s33-exact-bf16/chain_probe.py OUT.json [WINDOW [CHAINS]]
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from convert.hf import load_target
from jaxspec import tree as trees
from jaxspec.engine import Engine
from jaxspec.model import commit, init_state
from jaxspec.tokenizer import load_tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from windows import windows  # noqa: E402

window = int(sys.argv[2]) if len(sys.argv) > 2 else 15
chains = int(sys.argv[3]) if len(sys.argv) > 3 else 2
T = 16 * chains
t = load_target("jaxspec/demo/target", dtype="bfloat16")
tok = load_tokenizer("jaxspec/demo/target")
prompts = windows(tok)
p = prompts[window]
a = [int(x) for x in Engine(t, None, stop_tokens=()).generate([p], T + 1, max_len=300).tokens[0]]
taps = tuple(range(t.cfg.num_layers))
fwd = jax.jit(lambda tokens, state, tr: t(tokens, state, tr, taps=taps))
com = jax.jit(lambda s, pend, tr, path, n: commit(t.cfg, s, pend, tr, path, n))


def run(tokens, state):
    tr = trees.chain(1, len(tokens))
    lg, tp, s, pend = fwd(jnp.asarray([tokens]), state, tr)
    n = len(tokens)
    return np.asarray(lg[0], np.float32), np.asarray(tp[0], np.float32), com(s, pend, tr, jnp.arange(n)[None],
                                                                            jnp.asarray([n]))


_, _, st = run(p, init_state(t.cfg, 1, 300))
steps_lg, steps_tp, s = [], [], st
for x in a[:T]:
    lg, tp, s = run([x], s)
    steps_lg.append(lg[0]); steps_tp.append(tp[0])
chain_lg, chain_tp, s = [], [], st
for c in range(chains):
    lg, tp, s = run(a[16 * c:16 * c + 16], s)
    chain_lg.append(lg); chain_tp.append(tp)
chain_lg, chain_tp = np.concatenate(chain_lg), np.concatenate(chain_tp)
steps_lg, steps_tp = np.stack(steps_lg), np.stack(steps_tp)
rows = []
for r in range(T):
    rows.append({"row": r, "logits_equal": bool(np.all(steps_lg[r] == chain_lg[r])),
                 "argmax_steps": int(steps_lg[r].argmax()), "argmax_chain": int(chain_lg[r].argmax()),
                 "first_layer_differing": next((l for l in range(len(taps))
                                                if np.any(steps_tp[r, l] != chain_tp[r, l])), None)})
out = {"window": window, "ar_tokens": a[:T + 1], "rows": rows}
for row in rows:
    print(row)
json.dump(out, open(sys.argv[1], "w"), indent=1)
