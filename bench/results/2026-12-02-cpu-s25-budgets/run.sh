cd /work/main
export PYTHONPATH=. PYTHONUNBUFFERED=1
.venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 4 8 16 63 --out /tmp/s25/cpub/cpu-eval-16-shipped-budgets.json > /tmp/s25/cpub/e.log 2>&1
echo "rc=$?" >> /tmp/s25/cpub/e.log
