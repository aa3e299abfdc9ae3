#!/bin/bash
# #6 (nvidia-h200, two calls, ~7 + ~5 min): sampled rounds before and after session 48's sort-free sampling transform.
# Before (9b0daea), `sampling.log_probs` ran lax.top_k over the whole vocabulary (XLA's GPU backend lowers that to a
# sort of each 248320-token row: 1.5 ms for a [15, V] tree build on the H200, 2026-11-29, jaxspec/ddtree.py) and top-p
# sorted the row again; a sampled DDTree round does both for the drafter's 15 rows and the target's 64, a DFlash
# round for 15 and 16, an AR step for 1. After, top-k is ddtree.vocab_top_k (counted in levels on a GPU), top-p
# comes from its k candidates, and top-p alone searches its threshold: on a GPU 15 thresholds a pass, 9 passes over
# the row (`sampling.nucleus_ways`), a CPU bisects (32 passes; 16-way there is 3-6x slower, compute-bound).
#   Settings: greedy (control: unchanged code path, must match within noise), 0.6,20,0.95 (Qwen's recommended
#   sampling), 0.7,0,0.9 (top-p alone). Real shape, 1K, random bf16 weights, one lease, base then new per setting.
#   Predicted: greedy equal (+-0.1 ms). 0.6,20,0.95: DDTree(63) and DFlash rounds 3-10 ms shorter than base, the AR
#   step 0.2-1.5 ms shorter; new within 0.3-0.8 ms of greedy for the rounds, 0.1-0.3 for AR. 0.7,0,0.9: base as
#   slow as or slower than with top-k; new 0.2-0.6 ms above greedy for DDTree(63) (9 passes over [64, V] f32),
#   0.1-0.4 for DFlash, <= 0.2 for AR; WAYS2=1 adds a copy that bisects on the GPU too (`_alt_ways2/`, 32 passes):
#   predicted 0.3-0.8 ms longer than new for DDTree(63). Keep 16 ways only if new is shorter than ways2 by >= 0.1 ms
#   in DDTree(63) and not longer in DFlash; else make nucleus_ways return 2. If new is slower than base anywhere,
#   say so in bench/NOTES.md and look at a trace before keeping it.
# Needs `_base48/` (the base tree with this session's bench.rounds, which has --sampling; untracked, so it travels):
#   mkdir _base48 && git archive 9b0daea jaxspec pallas_kernels bench convert pyproject.toml ':!jaxspec/demo' \
#     ':!bench/results' ':!bench/next' | tar x -C _base48 && cp bench/rounds.py bench/cli.py _base48/bench/
#   (session 55's base run failed without bench/cli.py. A CPU dry run with the local .venv did not show it: the
#   editable install serves bench/ modules missing from _base48/ out of the main tree)
#   OUT=... SETTINGS="0 0.6,20,0.95" bash bench/next/k_sampled_rounds.sh (then tests/test_sampling.py on the
#   GPU, ~1 min; NO_TESTS=1 skips it), then NO_TESTS=1 WAYS2=1 SETTINGS=0.7,0,0.9 in a second call (~5 min)
#   (each run ~100 s at the real shape; writes $OUT/sampled-rounds.tgz; CONFIG=tiny JAX_PLATFORMS=cpu: a dry run,
#   ~4 min)
# Session 50 ran NO_TESTS=1 SETTINGS="0 0.6,20,0.95" (bench/results/2026-12-05-h200-s50/call1-sampled-rounds/:
# sampled DFlash 20.71 -> 17.54, DDTree(63) 25.87 -> 20.78, AR loop 13.58 -> 13.43 ms);
# Session 55 ran NO_TESTS=1 WAYS2=1 SETTINGS=0.7,0,0.9 on an H100 (bench/results/2026-12-05-h100-s55/sampled-rounds/):
# 16 ways against ways2: DDTree(63) 28.43 -> 29.56, DFlash 24.57 -> 24.94, AR loop 18.90 -> 19.18 ms; 16 ways kept.
# Its base run failed (no bench/cli.py in _base48/).
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
CONFIG=${CONFIG:-real}
grep -q -- "--sampling" _base48/bench/rounds.py 2>/dev/null || {
  echo "no _base48/ with --sampling: see the header"; exit 2; }
W=${W:-$(mktemp -d)}; mkdir -p $W   # W=$OUT/...: the logs land where a cut-off call still returns them
START=$SECONDS
trap 'tar czf $OUT/sampled-rounds.tgz -C $W .' EXIT
rounds() {  # NAME SAMPLING (from the tree it is called in)
  timeout 150 python -m bench.rounds --config $CONFIG --context 1024 --phases ar,ddtree,dflash \
    --rounds-only --budgets 63 --round-budget 63 --ar-rounds 20 --max-len 8192 --sampling $2 \
    --out $W/rounds-$1.json > $W/rounds-$1.log 2>&1
  echo "rounds $1 rc=$? at $((SECONDS - START)) s"; grep -E "_round(_device_loop)? " $W/rounds-$1.log | cut -c1-120
}
if [ -n "$WAYS2" ]; then
  rm -rf _alt_ways2 && mkdir _alt_ways2 && cp -r jaxspec pallas_kernels bench convert _alt_ways2/
  sed -i 's/    return 16 if jax.default_backend() == "gpu" else 2/    return 2/' _alt_ways2/jaxspec/sampling.py
  grep -q "^    return 2$" _alt_ways2/jaxspec/sampling.py || { echo "the ways-2 copy did not take"; exit 2; }
fi
for S in ${SETTINGS:-0 0.6,20,0.95 0.7,0,0.9}; do
  rounds new-$S $S
  (cd _base48 && rounds base-$S $S)
  [ -z "$WAYS2" ] || (cd _alt_ways2 && rounds ways2-$S $S)
done
if [ "$JAX_PLATFORMS" != cpu ] && [ -z "$NO_TESTS" ]; then
  # The transform's tests on the GPU's compiled programs (the counted top-k is the GPU's default there).
  timeout 100 python -m pytest -q -rA tests/test_sampling.py -p no:cacheprovider > $W/gpu-tests-sampling.log 2>&1
  echo "sampling tests rc=$? at $((SECONDS - START)) s"; tail -2 $W/gpu-tests-sampling.log
fi
