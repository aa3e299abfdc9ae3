cd /work/main
export PYTHONPATH=.
STD=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
.venv/bin/python -m jaxspec.train drafter --target jaxspec/demo/target --text $STD/test/*.py --package-text 3000 \
  --mask-token-id 1 --data greedy --prompt-len 64 --gen-new 192 --gen-batch 256 --batch 8 --anchors 32 \
  --ckpt-every 250 --dtype bfloat16 --seed 21 --out /tmp/s18/cpu/run --init jaxspec/demo/drafter \
  --sequences 4096 --steps 4000 --lr 6e-4 --gamma 4 --time-budget-s 2100 > /tmp/s18/cpu/train.log 2>&1
echo "rc=$?" >> /tmp/s18/cpu/train.log
.venv/bin/python -m jaxspec.train eval --target jaxspec/demo/target --draft /tmp/s18/cpu/run/drafter \
  --text $(cat /tmp/s18/files.txt) --out /tmp/s18/cpu/eval.json > /tmp/s18/cpu/eval.log 2>&1
echo done > /tmp/s18/cpu/done
