# Session 34: the shipped pair on the 2-core CPU host, alone, with the drafter in bf16 under the fp32 target and a
# shorter block (8: chains of 8, trees at most 7 deep), DDTree at budgets 4 / 8 / 16, on the 16 held-out prompts, twice.
# Expected (written before the run): session 32 had DDTree(4) / (8) at 1.00-1.05x AR with blocks 6-8 and session 30's
# drafter in fp32; the bf16 drafter gained ~0.07x at block 16 here, so DDTree(8) at 1.00-1.10x AR, tau ~3.0-3.2.
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=bench/results/2026-12-03-h200-s34/cpu-block8
for run in 1 2; do
.venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
  --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 4 8 16 \
  --block-size 8 --draft-dtype bfloat16 --out $O/cpu-eval-16-block8-draftbf16-$run.json 2>&1 \
  | grep -v "^WARNING: Location" > $O/eval-$run.log
done
echo done
