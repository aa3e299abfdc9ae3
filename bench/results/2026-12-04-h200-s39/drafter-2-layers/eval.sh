cd /work/main
export PYTHONPATH=. PYTHONUNBUFFERED=1
.venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft /tmp/s39/drafter \
  --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 4 8 16 \
  --block-size 8 --draft-dtype bfloat16 --out /tmp/s39/eval-16.json 2>&1 | grep -v "^WARNING: Location" > /tmp/s39/eval-16.log
echo done
