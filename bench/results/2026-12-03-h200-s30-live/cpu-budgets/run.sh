# The installed demo pair (s25 target + this session's call-3 drafter) at DDTree budgets 4 / 8 / 16 / 32 / 63 on the
# 16 held-out prompts, on the 2-core CPU host, alone on the machine: which budget `jaxspec.generate` should default to.
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=bench/results/2026-12-03-h200-s30-live/cpu-budgets
.venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
  --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 4 8 16 32 63 \
  --out $O/cpu-eval-16-budgets.json > $O/eval.log 2>&1
echo "rc=$?" >> $O/eval.log
