#!/bin/bash
# Archived after it ran (session 60): the record of call 4; run from the repository root as bench/next/s60b.sh.
# Session 60's second lease (bench/NOTES.md "Session 60"): tree attention's row blocks read the tree's key tiles only
# up to the last node they see (`tree_columns`). Its GPU tests, then the 8K prefill with its profile by part in this
# tree and in _alt_base/ (the commit before), one lease.
#   mkdir _alt_base && git archive 863ad89 jaxspec pallas_kernels convert pyproject.toml \
#     bench/{__init__,harness,cli,profile}.py | tar -x -C _alt_base && rm -r _alt_base/jaxspec/demo
#   OUT=... bash bench/next/s60b.sh          (device call with carry: ["_alt_base"])
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1 | tee $OUT/gpu.txt
timeout 150 python -m pytest -q -rA -m gpu tests/test_tree_attention_kernel.py -p no:cacheprovider --durations=5 \
  > $OUT/gpu-tests-ta.log 2>&1
echo "tree attention GPU tests rc=$?: $(tail -1 $OUT/gpu-tests-ta.log)"
for t in new base; do
  d=.; [ $t = base ] && d=_alt_base
  (cd $d && timeout 100 python -m bench.harness --config real --contexts '' --prompt 8192 --profile-prefill \
     --out $OUT/prefill-$t.json > $OUT/prefill-$t.log 2>&1; echo "prefill $t rc=$?")
  grep -v "^WARNING: Location" $OUT/prefill-$t.log | grep -E "prefill P=|rror" | tail -3
done
