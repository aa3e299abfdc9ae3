# Offline DFlash vs the engine (session 14): PYTHONPATH=. python sim.py TARGET DRAFTER N_PROMPTS (run from the repo root)
# Offline DFlash on the AR greedy sequence: at anchor a, the full block drafted from the teacher-forced target
# features of seqs[:a] and anchor seqs[a]; accepted = matching prefix; next anchor a + L + 1. Compare with the
# engine's tau on the same prompts (greedy: the engine must give exactly this if its drafter context is right).
import json, sys, numpy as np, jax, jax.numpy as jnp
from flax import nnx
from convert.drafter import load_draft
from convert.store import load_model
from jaxspec.tokenizer import load_tokenizer
from jaxspec import train
from jaxspec import tree as trees
from jaxspec.model import init_state
from jaxspec.dflash import DFlash
from jaxspec.engine import Engine

tdir, ddir = sys.argv[1], sys.argv[2]
files = json.load(open('bench/results/2026-11-30-cpu-demo-drafter-run5-eval.json'))['prompts']['text']
target = load_model(tdir, dtype="float32"); drafter = load_draft(ddir, dtype="float32")
prompts = train.prompts_from(train.text_docs(load_tokenizer(tdir), files), 16, 64, 4)[:int(sys.argv[3])]
max_new = 128; block = drafter.cfg.block_size
with jax.default_matmul_precision("highest"):
    ar = Engine(target, None, stop_tokens=())
    eng = Engine(target, DFlash(drafter, target.cfg, block), stop_tokens=())
    max_len = 64 + max_new + block + 2
    seqs = np.stack([np.concatenate([p, ar.generate([list(map(int, p))], max_new, max_len=max_len).tokens[0]]) for p in prompts]).astype(np.int32)
    hist = None
    for p in prompts:
        r = eng.generate([list(map(int, p))], max_new, max_len=max_len)
        hist = r.hist if hist is None else hist + r.hist
    tau_engine = float((hist * np.arange(len(hist))).sum() / hist.sum())
    b, t = seqs.shape
    logits, taps, _, _ = target(jnp.asarray(seqs), init_state(target.cfg, b, t), trees.chain(b, t),
                                taps=tuple(drafter.cfg.target_layer_ids))
    embed, head = target.embed_tokens[...], target.unembedding()
    graphdef, weights = nnx.split(drafter)
    @jax.jit
    def drafts(weights, taps, seqs, a):
        d = nnx.merge(graphdef, weights)
        cache = d.add_context(d.init_cache(b, t + block), taps, jnp.full((b,), a, jnp.int32))
        return jnp.argmax(d.draft(cache, seqs[:, a], embed, head)[0], -1)
    D = {a: np.asarray(drafts(weights, taps, jnp.asarray(seqs), jnp.int32(a))) for a in range(63, t - 1)}
    rounds = toks = 0
    for i in range(b):
        # engine: after prefill, pending = seqs[64] (AR's first token); first round anchors at 64
        a = 64
        end = 64 + max_new
        while a < end:
            d = D[a][i] if a in D else np.zeros(block - 1, int)
            L = 0
            while L < block - 1 and a + 1 + L < end and d[L] == seqs[i, a + 1 + L]:
                L += 1
            n = min(L + 1, end - a)
            rounds += 1; toks += n; a += n
    print(json.dumps({"tau_engine": tau_engine, "tau_offline": toks / rounds, "rounds_offline": rounds,
                      "rounds_engine": int(hist.sum())}))
