export PYTHONUNBUFFERED=1
run() {  # dir tag
  cd $1 && PYTHONPATH=. /work/main/.venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
  --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 4 8 16 \
  --block-size 8 --draft-dtype bfloat16 --out /tmp/ab-$2.json 2>&1 | grep -v "^WARNING: Location" > /tmp/ab-$2.log
}
run /tmp/wt37 s37-1
run /work/main s38-2
run /tmp/wt34 s34-2
run /tmp/wt37 s37-2
echo done
