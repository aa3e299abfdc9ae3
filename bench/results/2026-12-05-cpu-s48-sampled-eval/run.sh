# Session 48: the demo pair's tau and speed on this 2-core CPU, greedy and sampled with Qwen's recommended settings
# (T 0.6, top-k 20, top-p 0.95), the 16 held-out prompts, block 8, DDTree budgets 8 and 16 (the CPU's defaults:
# block 8, budget 8), the drafter in the target's fp32 (the CPU default).
# Expected (written before the run): greedy taus as session 34's fp32-drafter run to +-0.02 (DFlash ~2.7 at block 8,
# DDTree(8) ~3.16); sampled taus lower than greedy: DFlash (rejection sampling) 0.2-0.6 lower, DDTree (sampled walk)
# 0.1-0.5 lower; speedups on this host 0.7-1.1x.
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=bench/results/2026-12-05-cpu-s48-sampled-eval
for mode in greedy sampled; do
  extra=""; [ $mode = sampled ] && extra="--temperature 0.6 --top-k 20 --top-p 0.95"
  .venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
    --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 8 16 \
    --block-size 8 $extra --out $O/cpu-eval-16-block8-$mode.json 2>&1 | grep -v "^WARNING: Location" > $O/eval-$mode.log
  echo done $mode
done
