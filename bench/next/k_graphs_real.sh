#!/bin/bash
# #6 (nvidia-h200, one call, ~5 min): does XLA's minimum command-buffer size keep the AR loop with the fused GDN
# one-token kernel out of a CUDA graph? Session 39's tiny-config log (bench/results/2026-12-04-h200-s39/graphs/):
# XLA's conversion pass finds the AR loop's WHILE convertible both ways, then leaves it out because the sequence
# holding it ([copy, while]) counts fewer thunks than xla_gpu_graph_min_graph_size (the pass does not count the
# body). A WHILE that is not convertible instead has its body converted piece by piece, which is what the default
# real-shape loop shows (136 of 1248 kernels a step visible). Hypothesis: with the fused kernel the real loop's WHILE
# becomes convertible and is then dropped for its size. Three AR loops at the real shape, 1K context, 100 rounds a
# call: the default; the default with min graph size 1; the fused kernel with min graph size 1. The default one also
# logs which thunks the pass could not convert.
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:?}
A="--config real --context 1024 --phases ar --rounds-only --budgets 16 --round-budget 16 --max-len 8192"
TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_conversion_pass=2 python -m bench.rounds $A \
  --out $OUT/ar-default.json 2>&1 | grep -v " graph: " | grep "rounds \|Unsupported\|not convertible\|not enabled\|not lowered" \
  | sed 's/^I[0-9 :.]*[0-9]* //' | sort | uniq -c | sort -rn | head -40 > $OUT/ar-default.log
tail -3 $OUT/ar-default.log
XLA_FLAGS=--xla_gpu_graph_min_graph_size=1 python -m bench.rounds $A --out $OUT/ar-default-min1.json > $OUT/ar-default-min1.log 2>&1
tail -2 $OUT/ar-default-min1.log | cut -c1-300
JAXSPEC_GDN_DECODE=pallas_triton XLA_FLAGS=--xla_gpu_graph_min_graph_size=1 python -m bench.rounds $A \
  --out $OUT/ar-gdn-min1.json > $OUT/ar-gdn-min1.log 2>&1
tail -2 $OUT/ar-gdn-min1.log | cut -c1-300
