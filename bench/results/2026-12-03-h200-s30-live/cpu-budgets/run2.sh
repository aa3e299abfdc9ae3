# After run.sh: budgets 8 and 16 twice more on the 16 prompts (one run's speedups vary by ~0.1-0.2x), then the 48
# prompts at budgets 8 / 16 / 32 (64 is in ../call3/cpu-eval-48.json). Alone on the 2-core CPU host.
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=bench/results/2026-12-03-h200-s30-live/cpu-budgets
ev() { .venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter "$@"; }
for i in 2 3; do
  ev --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 8 16 \
    --out $O/cpu-eval-16-budgets-$i.json > $O/eval-$i.log 2>&1; echo "rc=$?" >> $O/eval-$i.log
done
ev --text $(cat bench/results/2026-12-01-h200-s19-pair-wide-prompts/eval-48-files.txt) --prompts 48 --seed 5 \
  --budgets 8 16 32 --out $O/cpu-eval-48-budgets.json > $O/eval-48.log 2>&1; echo "rc=$?" >> $O/eval-48.log
