cd /work/main
export PYTHONPATH=. PYTHONUNBUFFERED=1
for a in 0 1; do
  .venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft /tmp/ab/soft$a/drafter --budgets 16 \
    --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 \
    --out /tmp/ab/eval-16-soft$a.json > /tmp/ab/eval-16-soft$a.log 2>&1
done
echo ALLDONE >> /tmp/ab/eval-16-soft1.log
