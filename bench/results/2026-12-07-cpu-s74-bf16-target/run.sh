# Session 74: the shipped pair on the 2-core CPU host (AMX: amx_bf16, avx512_bf16) with the TARGET in bf16 as
# well as the drafter, against session 38's command (fp32 target, bf16 drafter), the 16 held-out prompts, in turn.
# Why: the README's prompt at 128 tokens ran DDTree(8) at 1.68x bf16 AR with both in bf16 against 1.03x in fp32.
# Expected (written before the run): bf16 AR as fast as fp32 AR (+-10%); DDTree(8) at 1.3-1.7x bf16 AR; taus within
# 0.15 of fp32's; identical to bf16 AR on >= 14 / 16 (a product's rounding may depend on its rows).
cd "$(git rev-parse --show-toplevel)"
export PYTHONPATH=. PYTHONUNBUFFERED=1
O=bench/results/2026-12-07-cpu-s74-bf16-target
for dt in float32 bfloat16; do
  .venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter \
    --text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4 --budgets 4 8 16 \
    --block-size 8 --dtype $dt --draft-dtype bfloat16 --out $O/cpu-eval-16-block8-target-$dt.json 2>&1 \
    | grep -v "^WARNING: Location" > $O/eval-16-target-$dt.log
done
echo done
