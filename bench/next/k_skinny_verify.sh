#!/bin/bash
# Ran in session 41 (bench/results/2026-12-04-h200-s41/verify/); needs `auto`, removed afterwards: a record only.
# #6 (nvidia-h200, one call, ~7 min): why the one-wave Mosaic GPU matmul made the rounds slower inside the model
# (session 41: DFlash 17.91 -> 18.30 ms, DDTree(63) 22.78 -> 23.02 with JAXSPEC_SKINNY_MATMUL=auto) when it streamed
# the narrow products faster alone. The DFlash group without --rounds-only: the standalone verify(16)'s wall and
# device (kernel) time, for =reference and =auto. Device time lower with auto: the loss is in launches / graph
# gaps; higher: in the kernel or the XLA ops around it (pad, split-K sum, transpose).
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
OUT=${OUT:?}
for S in reference auto; do
  JAXSPEC_SKINNY_MATMUL=$S timeout 200 python -m bench.rounds --config real --context 1024 --phases dflash \
    --max-len 8192 --out $OUT/verify-$S.json > $OUT/verify-$S.log 2>&1
  echo "$S rc=$?"; grep "verify\|dflash_round " $OUT/verify-$S.log | cut -c1-220
done
