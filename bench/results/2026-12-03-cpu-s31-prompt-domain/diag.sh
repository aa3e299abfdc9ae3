cd /work/main
export PYTHONPATH=. PYTHONUNBUFFERED=1
for arm in P S E; do
  case $arm in
    P) T="--text $(cat /tmp/s31/drafter-prompt-files.txt) --package-text 3000";;
    S) T="--text $(cat /tmp/s31/target-train-files.txt)";;
    E) T="--text $(cat bench/results/2026-12-01-h200-s19-pair-wide-prompts/eval-48-files.txt)";;
  esac
  rm -rf /tmp/s31/diag-$arm
  /usr/bin/time -f "$arm wall %e s" .venv/bin/python -m jaxspec.train drafter --target jaxspec/demo/target $T --mask-token-id 1 \
    --init jaxspec/demo/drafter --data greedy --features live --sequences 288 --val-sequences 256 --gen-batch 96 \
    --batch 16 --anchors 16 --steps 1 --lr 1e-12 --dtype float32 --seed 41 --out /tmp/s31/diag-$arm > /tmp/s31/diag-$arm.log 2>&1
  echo "$arm rc=$? $(cat /tmp/s31/diag-$arm/val_loss.json 2>/dev/null)"
done
