cd /work/main
export PYTHONUNBUFFERED=1 PYTHONPATH=.
T="--text $(cat bench/results/2026-12-01-h200-s22-pair-share08/eval-16-files.txt) --seed 4"
for cfg in "16:4 8 16 64" "8:4 8 16" "6:4 8" "4:4 8" "16:4 8 16 64"; do
  bs=${cfg%%:*}; b=${cfg#*:}; n=$(ls /tmp/s32/il/*.json 2>/dev/null | wc -l)
  .venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft jaxspec/demo/drafter --budgets $b --block-size $bs \
    --unseen-by bench/results/2026-12-02-h200-s25-pair-stdlib08/results.json --out /tmp/s32/il/f32-16-bs$bs-$n.json $T 2>&1 | grep -v "^WARN" > /tmp/s32/il/f32-16-bs$bs-$n.log
done
echo ALLDONE >> /tmp/s32/il/done
