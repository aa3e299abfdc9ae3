# `python -m jaxspec.train eval` with the GDN chain solved one node at a time (jaxspec.model.CHUNK = 1): a verify's
# chain then runs as a scan of one-node delta-rule steps, each folded into the state as AR's commit folds one token.
#   PYTHONPATH=. python bench/results/2026-12-03-cpu-s33-exact-bf16/chunk1.py [eval flags]
# CHUNK_OVERRIDE=N picks another block length (64 is the engine's).
import os
import sys

import jaxspec.model
from jaxspec import train

jaxspec.model.CHUNK = int(os.environ.get("CHUNK_OVERRIDE", "1"))
print(f"jaxspec.model.CHUNK = {jaxspec.model.CHUNK}", file=sys.stderr)
sys.exit(train.main(["eval"] + sys.argv[1:]))
