for T in 0.7 1.4 2.0 1.0; do
  TREE_T=$T PYTHONPATH=. .venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 64 --out /tmp/s23/exp/t$T.json > /tmp/s23/exp/t$T.log 2>&1
done
