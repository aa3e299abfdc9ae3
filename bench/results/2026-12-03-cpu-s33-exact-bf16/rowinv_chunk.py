# Session 32's per-layer comparison (../2026-12-03-cpu-s32-bf16/rowinv.py: a chain of 8 tokens at once against 8
# one-token steps with a commit after each) with jaxspec.model.CHUNK set first (CHUNK_OVERRIDE, default 1).
#   PYTHONPATH=. python bench/results/2026-12-03-cpu-s33-exact-bf16/rowinv_chunk.py bfloat16 OUT.json
import os
import runpy
import sys

import jaxspec.model

jaxspec.model.CHUNK = int(os.environ.get("CHUNK_OVERRIDE", "1"))
print(f"jaxspec.model.CHUNK = {jaxspec.model.CHUNK}")
runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "2026-12-03-cpu-s32-bf16", "rowinv.py"), run_name="__main__")
