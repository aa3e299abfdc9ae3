#!/bin/bash
# #9 on nvidia-h200-x4, call 2 (<= 9.5 min): TP = 4 against TP = 1 token identity (greedy AR, DFlash, DDTree(64);
# real widths and head counts, 5 layers, fp32: bench.tp's identity model), the GPU collectives test at TP = 2 and 4,
# then TP = 2 identity again on GPUs 2,3 beside the skinny matmul's Mosaic GPU tests and bench on GPU 0 (#6).
# JAXSPEC_COMMIT=<hash> bash bench/next/x4_identity.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
R=/tmp/x4i; mkdir -p $R/km
trap '(cd $R && tar czf $OUT/x4_identity.tgz .); cat $R/a.log; grep -h "identity\|passed\|failed" $R/*.log | cut -c1-160; grep -h "TB/s" $R/km/*.log | tail -30' EXIT
timeout 330 python -m bench.tp --config real --tp 4 --contexts "" --deadline-s 300 --out $R/tp4-identity.json \
  > $R/tp4-identity.log 2>&1
echo "tp4-identity rc=$? $(el)s" >> $R/a.log
JAX_PLATFORMS=cuda timeout 90 python -m pytest -q -m gpu tests/test_sharding.py -rA > $R/gpu_sharding_test.log 2>&1
echo "gpu sharding test rc=$? $(el)s" >> $R/a.log
REST=$(( 560 - $(el) ))
(CUDA_VISIBLE_DEVICES=2,3 timeout $REST python -m bench.tp --config real --tp 2 --contexts "" --deadline-s $((REST - 30)) \
  --out $R/tp2-identity.json > $R/tp2-identity.log 2>&1; echo "tp2-identity rc=$? $(el)s" >> $R/a.log) &
(export CUDA_VISIBLE_DEVICES=0 JAX_PLATFORMS=cuda
 timeout $((REST / 2)) python -m pytest -q -m gpu tests/test_skinny_matmul_mosaic.py -rA > $R/km/tests.log 2>&1
 echo "mosaic tests rc=$? $(el)s" >> $R/a.log
 timeout $(( 560 - $(el) - 10 )) python -m pallas_kernels.skinny_matmul.bench --rows 16,64,65 \
   --shapes mlp.gate_proj,mlp.down_proj,attn.k_proj,gdn.in_proj_qkv,attn.o_proj --impls xla,pallas_mosaic \
   --json $R/km/mm.json > $R/km/bench.log 2>&1
 echo "mosaic bench rc=$? $(el)s" >> $R/a.log) &
wait
