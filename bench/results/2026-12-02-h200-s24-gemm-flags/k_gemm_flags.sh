#!/bin/bash
# #6 (nvidia-h200, one call, <= 6 min): can XLA's own gemm choices stream the 64-row verify's weights faster?
# Session 23 (bench/results/2026-12-02-h200-s23-peel-graphs-eval/peel/verify-tree64.json) profiled verify(64) at
# 21.12 ms of kernels, 15.03 of them gemms (~3.4 TB/s over the 51 GB of weights; the one-row AR step's gemms run at
# ~4.2). The MLP's gate/up go to a cuBLAS kernel (nvjet_sm90_tss_384x64, 5.94 ms), the rest to Triton gemm fusions
# XLA autotuned over its default tile list. Three profiles of verify(64), real 27B shapes, random bf16 weights, 1K:
#   default | --xla_gpu_cublas_fallback=false (every gemm a Triton fusion) | --xla_gpu_exhaustive_tiling_search=true
# Predicted: default 21.1 +- 0.3 ms; without the cuBLAS fallback within +-0.5 ms of default; the exhaustive search
# -0.3 to -1.5 ms of gemm time if it compiles inside its limit (it autotunes ~10 distinct gemm shapes).
# JAXSPEC_COMMIT=<hash> bash bench/next/k_gemm_flags.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/kg; mkdir -p $W
trap '(cd $W && tar czf $OUT/kg.tgz .); cat $W/compare.txt 2>/dev/null; grep -h "rc=" $W/*.log' EXIT
run() {  # name limit [XLA flags]
  mkdir -p $W/$1
  XLA_FLAGS="$3" timeout $2 python -m bench.verify_profile --config real --nodes 64 --tree --out $W/$1 > $W/$1.log 2>&1
  echo "verify_profile $1 rc=$?" >> $W/$1.log
}
run default 90; run no_cublas 95 --xla_gpu_cublas_fallback=false; run exhaustive 150 --xla_gpu_exhaustive_tiling_search=true
python - <<'PY' > $W/compare.txt 2>&1
import json, os
for name in ("default", "no_cublas", "exhaustive"):
    f = f"/tmp/kg/{name}/verify-tree64.json"
    if not os.path.exists(f):
        print(f"{name:10s} no profile (see {name}.log)"); continue
    d = json.load(open(f))
    top = ", ".join(f"{k['kernel'][:28]} {k['ms_per_step']:.2f}" for k in d["top_kernels"][:4])
    print(f"{name:10s} kernel {d['kernel_ms_per_step']:.3f} ms  gemms {d['gemm_ms_per_step']:.3f}  "
          f"kernels {d['kernels_per_step']:.0f}  compile {d.get('compile')}  top: {top}")
PY
