"""The 16 prompts of this directory's engine probes: a 64-token window of each of the first 16 of this repository's
jaxspec/*.py files (at 95a3bc8), at offsets drawn with seed 3."""
import glob

import numpy as np


def windows(tok, count: int = 16, length: int = 64, seed: int = 3) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out = []
    for f in sorted(glob.glob("jaxspec/*.py"))[:count]:
        ids = tok.encode(open(f).read())
        s = int(rng.integers(0, max(1, len(ids) - length)))
        out.append(ids[s:s + length])
    return out
