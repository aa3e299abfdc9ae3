# Session 34: the shipped pair's drafter in float32 and in bfloat16 under the float32 target, DDTree(16) (the CPU
# default) and DFlash on the 16 held-out prompts, alternating twice, alone on the 2-core CPU host.
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=bench/results/2026-12-03-h200-s34/cpu-draft-dtype
for run in 1 2; do for t in float32 bfloat16; do
.venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
  --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 16 \
  --draft-dtype $t --out $O/cpu-eval-16-draft-$t-$run.json 2>&1 | grep -v "^WARNING: Location" > $O/eval-16-draft-$t-$run.log
done; done
echo done
