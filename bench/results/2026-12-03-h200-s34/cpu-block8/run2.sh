# Session 34, after run.sh: the same setting (block 8, DDTree(8), drafter bf16) on the 48 held-out prompts, and the
# drafter in fp32 at block 8 on the 16 as the control for the dtype. Alone on the 2-core CPU host.
# Expected (written before): on 48, DDTree(8) ~0.9-1.0x (the 48 set's tau runs ~0.5 lower than the 16's at block 16);
# the fp32 control ~0.05-0.1x below the bf16 runs (1.15x / 1.09x).
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=bench/results/2026-12-03-h200-s34/cpu-block8
E=".venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter --block-size 8"
$E --text $(cat bench/results/2026-12-01-h200-s19-pair-wide-prompts/eval-48-files.txt) --prompts 48 --seed 5 \
  --budgets 8 --draft-dtype bfloat16 --out $O/cpu-eval-48-block8-draftbf16.json 2>&1 | grep -v "^WARNING: Location" > $O/eval-48.log
$E --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 8 \
  --draft-dtype float32 --out $O/cpu-eval-16-block8-draftf32.json 2>&1 | grep -v "^WARNING: Location" > $O/eval-16-f32.log
echo done
