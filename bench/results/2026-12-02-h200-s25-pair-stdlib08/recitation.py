"""Recitation of the shipped and the session-25 targets' greedy continuations on the 16 / 48 held-out prompt sets
(jaxspec.train.recitation, 16-token windows, against the stdlib files the s25 pair's results.json lists as its
target's training split; the shipped target trained on the same 2,798,695 tokens: s18 pair-results.json)."""
import json, sys
from pathlib import Path
import jax
import numpy as np
from convert.store import load_model
from jaxspec import train
from jaxspec.engine import Engine
from jaxspec.tokenizer import load_tokenizer

R = Path("bench/results/2026-12-02-h200-s25-pair-stdlib08")
trained, listed = train.trained_on(json.loads((R / "results.json").read_text()))
sets = {16: ("bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt", 16, 4),
        48: ("bench/results/2026-12-01-h200-s19-pair-wide-prompts/eval-48-files.txt", 48, 5)}
out = {"what": __doc__, "commit": train.git_commit(), "machine": train.machine(),
       "corpus_files": {"found": len(trained), "listed": listed}, "runs": {}}
for name, tdir in (("shipped", "jaxspec/demo/target"), ("s25", str(R / "pair/target"))):
    tok = load_tokenizer(tdir)
    corpus = train.text_docs(tok, trained)
    target = load_model(tdir, dtype="float32")
    eng = Engine(target, None, stop_tokens=())
    for n, (lst, prompts_n, seed) in sets.items():
        files = Path(lst).read_text().split()
        prompts = train.prompts_from(train.text_docs(tok, files), prompts_n, 64, seed)
        with jax.default_matmul_precision("highest"):
            toks = [eng.generate([list(map(int, p))], 128, max_len=64 + 128 + 20).tokens[0] for p in prompts]
        rec = train.recitation(prompts, toks, corpus)
        rep = train.repetition(prompts, toks)
        out["runs"][f"{name}-{n}"] = {"recitation": rec, "repetition_mean": rep["mean"],
                                      "not_reciting_prompts": sum(x is not None and x <= train.FRESH for x in rec["per_prompt"])}
        print(name, n, "recited", round(rec["mean"], 3), "above half", rec["share_of_prompts_above_half"],
              "prompts <= FRESH", out["runs"][f"{name}-{n}"]["not_reciting_prompts"], "repetition", round(rep["mean"], 3), flush=True)
Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
