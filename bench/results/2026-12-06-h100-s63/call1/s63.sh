#!/bin/bash
# Session 63's first call, either card (bench/NOTES.md, "Plan for the next GPU session", items 1-3):
#   an H200 runs #6's table at HEAD (item 1, bench/next/table.sh, ~9.5 min);
#   an H100 runs the chain op's GPU tests, the state pass's sweep and the 8K prefill with its profile by part, its
#   trace and optimized HLO kept (items 2-3, ENGINE=0 DUMP=1 bench/next/k_chain_next.sh, ~3 min).
#   OUT=... bash bench/next/s63.sh
OUT=${OUT:?}
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)
echo "card: $card"
if [[ $card == *H200* ]]; then
  OUT=$OUT bash bench/next/table.sh
else
  OUT=$OUT ENGINE=0 DUMP=1 bash bench/next/k_chain_next.sh
fi
