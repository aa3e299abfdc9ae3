cd /work/main
export PYTHONPATH=. PYTHONUNBUFFERED=1
for dt in $DTS; do
.venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
  --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 8 \
  --block-size 8 --dtype $dt --draft-dtype $dt --out /tmp/s39/dt/eval-target-$dt.json 2>&1 | grep -v "^WARNING: Location" > /tmp/s39/dt/eval-target-$dt.log
done
echo done
