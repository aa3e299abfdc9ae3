# Session 38: the shipped pair on the 2-core CPU host after the norm's scale moved after its product (bb4488a:
# RMSNorm.deferred), the same command as session 34's cpu-block8/run.sh (bf16 drafter, block 8, DDTree 4 / 8 / 16,
# the 16 held-out prompts), once.
# Expected (written before the run): the fp32 target's tokens and the taus as session 34's to +-0.02 (the change moves
# fp32 rounding only: 1e-7), every method identical to AR on 16 / 16; DDTree(8) at 1.05-1.15x AR.
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=bench/results/2026-12-04-cpu-s38-deferred-norm
.venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
  --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 4 8 16 \
  --block-size 8 --draft-dtype bfloat16 --out $O/cpu-eval-16-block8-draftbf16.json 2>&1 \
  | grep -v "^WARNING: Location" > $O/eval.log
echo done
# Then the 48 prompts (session 34's cpu-eval-48-block8-draftbf16.json: DDTree(8) 0.92x AR there).
.venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
  --text $(cat bench/results/2026-12-01-h200-s19-pair-wide-prompts/eval-48-files.txt) --prompts 48 --seed 5 \
  --budgets 4 8 16 --block-size 8 --draft-dtype bfloat16 --out $O/cpu-eval-48-block8-draftbf16.json 2>&1 \
  | grep -v "^WARNING: Location" > $O/eval-48.log
echo done-48
