cd /work/main
export PYTHONPATH=. PYTHONUNBUFFERED=1
for k in 4 2; do
.venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft /tmp/trunc/d$k \
  --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 8 \
  --block-size 8 --draft-dtype bfloat16 --out /tmp/trunc/eval-d$k.json 2>&1 | grep -v "^WARNING: Location" > /tmp/trunc/eval-d$k.log
done
echo done
