"""Which target layers tell a drafter the most about the next token? A linear-probe answer.

    PYTHONPATH=. python -m bench.tap_probe --target jaxspec/demo/target --text FILES.. --eval-text FILES.. \
        --out bench/results/tap-probe.json

A DFlash drafter's first draft at anchor a sees the target's hidden states up to a - 1 and the anchor
token x_a, and must name the target's greedy token x_{a+1}. This fits one softmax regression per choice
of tapped layers (a linear map into the target's lm_head), from [h_l(a - 1) for l in taps] + embed(x_a) to x_{a+1}, on the target's own greedy
continuations of prompts from --text, and reports top-1 agreement on continuations of --eval-text
prompts. A linear probe is a floor on what those features carry, not the drafter's accuracy; its use is
the ranking of tap choices (e.g. the last layer or not) before spending GPU time on training drafters.
"""

from __future__ import annotations

import argparse
import datetime
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench.cli import at_least, exit_with, writable_file, write_json
from jaxspec import tree as trees
from jaxspec.model import init_state
from pallas_kernels import dispatch


def features(target, seqs: np.ndarray, start: int, batch: int = 64):
    """For anchors a in [start, T - 2]: hidden [n, L, D] (every layer's output at a - 1), anchor ids [n] and
    labels [n] (x_{a+1}), flattened over sequences."""
    layers = tuple(range(target.cfg.num_layers))
    fwd = jax.jit(lambda t: target(t, init_state(target.cfg, t.shape[0], t.shape[1]),
                                   trees.chain(t.shape[0], t.shape[1]), taps=layers)[1])
    hs = []
    for i in range(0, len(seqs), batch):
        hs.append(np.asarray(fwd(jnp.asarray(seqs[i:i + batch])), np.float32)[:, start - 1:-2])   # [b, n, L, D]
    h = np.concatenate(hs)
    return (h.reshape(-1, *h.shape[2:]), seqs[:, start:-1].reshape(-1), seqs[:, start + 1:].reshape(-1))


def fit_probe(x, y, head, epochs: int, batch: int = 1024, lr: float = 3e-3, seed: int = 0):
    """Softmax regression x [n, F] -> y [n] through the target's own lm_head: logits = (x @ w + b) @ head,
    head [D, V] frozen, so the probe has F x D weights (not F x V, which memorises 64K anchors) and reads
    the vocabulary as the drafter does (Adam, minibatches of min(batch, n) rows: fewer rows than `batch` are
    one minibatch a step, not none). Returns (w, b)."""
    if not len(x):
        raise ValueError("fit_probe: no rows to fit")
    batch = min(batch, len(x))
    rng = np.random.default_rng(seed)
    w = jnp.asarray(np.random.default_rng(seed).normal(0, 0.01, (x.shape[1], head.shape[0])), jnp.float32)
    b = jnp.zeros((head.shape[0],), jnp.float32)
    params = (w, b)
    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)

    @jax.jit
    def step(params, m, v, t, xb, yb):
        def loss(p):
            logits = (xb @ p[0] + p[1]) @ head
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), yb[:, None], 1))
        g = jax.grad(loss)(params)
        m = jax.tree.map(lambda a, b_: 0.9 * a + 0.1 * b_, m, g)
        v = jax.tree.map(lambda a, b_: 0.999 * a + 0.001 * b_ * b_, v, g)
        upd = lambda p, a, c: p - lr * (a / (1 - 0.9 ** t)) / (jnp.sqrt(c / (1 - 0.999 ** t)) + 1e-8)
        return jax.tree.map(upd, params, m, v), m, v

    t = 0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for i in range(0, len(x) - batch + 1, batch):
            t += 1
            idx = order[i:i + batch]
            params, m, v = step(params, m, v, t, jnp.asarray(x[idx]), jnp.asarray(y[idx]))
    return params


def probe_inputs(h, anchor_emb, taps):
    x = np.concatenate([h[:, list(taps)].reshape(len(h), -1), anchor_emb], 1)
    mu, sd = x.mean(0), x.std(0) + 1e-6
    return x, mu, sd


def parse_taps(ap, text: str) -> list[tuple[int, ...]]:
    """--taps as tap sets of layer numbers, or the parser's error naming the flag (layer ranges: once loaded)."""
    try:
        sets = [tuple(int(x) for x in s.split(",")) for s in text.split(";") if s]
    except ValueError:
        ap.error(f"--taps {text!r}: expected ';'-separated sets of comma-separated layer numbers, e.g. 1,4,6;7")
    if not sets:
        ap.error(f"--taps {text!r}: no tap set")
    return sets


def main(argv=None) -> int:
    from convert.hf import CheckpointError
    from convert.store import load_model
    from jaxspec.config import ConfigError
    from jaxspec.tokenizer import load_tokenizer
    from jaxspec.train import git_info, greedy_generate, machine, prompts_from, text_docs

    ap = argparse.ArgumentParser(prog="python -m bench.tap_probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="target checkpoint directory (HF layout)")
    ap.add_argument("--text", nargs="+", required=True, help="files or dirs: prompts to fit the probes on")
    ap.add_argument("--eval-text", nargs="+", required=True, help="files or dirs: held-out prompts to score them on")
    ap.add_argument("--prompts", type=at_least(1), default=1024, help="fitting prompts")
    ap.add_argument("--eval-prompts", type=at_least(1), default=256, help="held-out prompts")
    ap.add_argument("--prompt-len", type=at_least(1), default=64, help="tokens of each prompt, cut from the text")
    ap.add_argument("--gen", type=at_least(2), default=64,
                    help="greedy tokens after each prompt (anchors are among them: gen - 1 per prompt)")
    ap.add_argument("--taps", default="1,4,6;1,4,7;6;7;4;1", help="';'-separated tap sets (comma-separated layers)")
    ap.add_argument("--epochs", type=at_least(1), default=4, help="passes of the probe's fit over the fitting anchors")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts' choice (held-out: seed + 1) and the fit")
    ap.add_argument("--out", required=True, help="JSON result path")
    args = dispatch.parse_args(ap, argv)
    writable_file(ap, "--out", args.out)
    tap_sets = parse_taps(ap, args.taps)

    t0 = time.time()
    try:
        target = load_model(args.target, dtype="float32")
    except (ConfigError, CheckpointError, OSError) as e:
        ap.error(f"--target {args.target}: {e}")
    tok = load_tokenizer(args.target)
    bad = [s for s in tap_sets if not all(0 <= l < target.cfg.num_layers for l in s)]
    if bad:
        raise SystemExit(f"--taps {args.taps}: layers must lie in 0..{target.cfg.num_layers - 1}, got {bad}")
    embed = np.asarray(target.embed_tokens[...], np.float32)
    head = jnp.asarray(target.unembedding(), jnp.float32)[:, :target.cfg.vocab_size]
    data = {}
    with jax.default_matmul_precision("highest"):
        for name, paths, n, seed in (("fit", args.text, args.prompts, args.seed),
                                     ("eval", args.eval_text, args.eval_prompts, args.seed + 1)):
            prompts = prompts_from(text_docs(tok, paths), n, args.prompt_len, seed)
            seqs = greedy_generate(target, prompts, args.gen, batch=min(256, n))
            data[name] = features(target, seqs, args.prompt_len)
            print(f"[tap_probe +{time.time() - t0:.0f}s] {name}: {len(seqs)} sequences, {len(data[name][2])} anchors",
                  flush=True)
    h, anc, y = data["fit"]
    he, anc_e, ye = data["eval"]
    results = []
    for taps in tap_sets:
        x, mu, sd = probe_inputs(h, embed[anc], taps)
        xe = (probe_inputs(he, embed[anc_e], taps)[0] - mu) / sd
        w, b = fit_probe((x - mu) / sd, y, head, args.epochs, seed=args.seed)
        pred = np.asarray(jnp.argmax((jnp.asarray(xe) @ w + b) @ head, -1))
        fit_pred = np.asarray(jnp.argmax((jnp.asarray((x[:20000] - mu) / sd) @ w + b) @ head, -1))
        results.append({"taps": list(taps), "eval_agreement": float((pred == ye).mean()),
                        "fit_agreement": float((fit_pred == y[:20000]).mean())})
        print(f"[tap_probe +{time.time() - t0:.0f}s] taps {taps}: held-out agreement {results[-1]['eval_agreement']:.3f} "
              f"(fit {results[-1]['fit_agreement']:.3f})", flush=True)
    out = {"what": "linear probes from the target's hidden states at a - 1 (the tapped layers) and embed(x_a) to "
                   "the target's greedy x_{a+1}: top-1 agreement (python -m bench.tap_probe)",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": git_info()["commit"], "machine": machine(), "jax": jax.__version__, "target": args.target, "prompts": args.prompts, "eval_prompts": args.eval_prompts,
           "prompt_len": args.prompt_len, "gen": args.gen, "epochs": args.epochs, "seconds": time.time() - t0,
           "results": results}
    write_json(args.out, out)
    return 0


if __name__ == "__main__":
    exit_with(main)
