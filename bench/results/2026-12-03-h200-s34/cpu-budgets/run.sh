# Session 34: the demo pair with this session's call-3 drafter installed, on the 2-core CPU host, alone on the machine:
# DDTree budgets 8 / 16 / 32 / 64 on the 16 held-out prompts and 16 / 32 / 64 on the 48, then the drafter in bfloat16
# under the float32 target (--draft-dtype bfloat16) on the 16 at budget 16.
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=bench/results/2026-12-03-h200-s34/cpu-budgets
E=".venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter"
$E --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 8 16 32 64 \
  --out $O/cpu-eval-16-budgets.json 2>&1 | grep -v "^WARNING: Location" > $O/eval-16.log
$E --text $(cat bench/results/2026-12-01-h200-s19-pair-wide-prompts/eval-48-files.txt) --prompts 48 --seed 5 \
  --budgets 16 32 64 --out $O/cpu-eval-48-budgets.json 2>&1 | grep -v "^WARNING: Location" > $O/eval-48.log
$E --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 16 \
  --draft-dtype bfloat16 --out $O/cpu-eval-16-draft-bf16.json 2>&1 | grep -v "^WARNING: Location" > $O/eval-16-draft-bf16.log
echo done
