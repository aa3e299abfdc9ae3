#!/bin/bash
# Archived after it ran (session 60): the record of call 1; run from the repository root as bench/next/s60.sh.
# Session 60's first call (bench/NOTES.md "Session 60"; plan items 0 and 4 of session 59's plan), either card:
#   0. the engine's GPU tests and the tree delta rule's chunked-prefill / model GPU tests with the chain's
#      block-parallel delta rule (4e73b78, never run on a GPU);
#   4. the 8K prefill with its profile by part, in this tree and in _alt_scan/ (4d6d09a: the scan over 64-token
#      blocks, each running the whole op), one lease.
#   mkdir _alt_scan && git archive 4d6d09a jaxspec pallas_kernels convert pyproject.toml \
#     bench/{__init__,harness,cli,profile}.py | tar -x -C _alt_scan && rm -r _alt_scan/jaxspec/demo
#   OUT=... bash bench/next/s60.sh          (device call with carry: ["_alt_scan"])
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1 | tee $OUT/gpu.txt
OUT=$OUT timeout 230 bash bench/next/gpu_tests.sh engine > /dev/null 2>&1
echo "engine GPU tests: $(grep -E 'passed|failed|error' $OUT/gpu-tests-engine.log | tail -1)"
timeout 100 python -m pytest -q -rA -m gpu tests/test_tree_delta_rule_kernel.py -k "chunked_prefill or model" \
  -p no:cacheprovider > $OUT/gpu-tests-tdr.log 2>&1
echo "tree delta rule GPU tests rc=$?: $(tail -1 $OUT/gpu-tests-tdr.log)"
for t in new scan; do
  d=.; [ $t = scan ] && d=_alt_scan
  (cd $d && timeout 110 python -m bench.harness --config real --contexts '' --prompt 8192 --profile-prefill \
     --out $OUT/prefill-$t.json > $OUT/prefill-$t.log 2>&1; echo "prefill $t rc=$?")
  grep -v "^WARNING: Location" $OUT/prefill-$t.log | grep -E "prefill P=|rror" | tail -3
done
