#!/bin/bash
# Next GPU session, #6 (nvidia-h200, one call, <= 9.5 min): does XLA's exhaustive gemm tiling search bring the 64-row
# verify's weight gemms nearer the one-row AR step's ~4.2 TB/s? Session 24
# (bench/results/2026-12-02-h200-s24-gemm-flags/) profiled verify(64) at 21.19 ms of kernels, 15.25 of them gemms:
# the MLP and GDN in_proj at 3.8-3.9 TB/s, the 6144 x 5120 projections (GDN out_proj, attention o_proj) at 2.76,
# q_proj at 3.06; the exhaustive search did not compile within 150 s. Here it gets ~430 s, and its per-fusion
# results go to a cache directory that a later call (carried back in $OUT) can load instead of searching again.
# Two processes, real 27B shapes, random bf16 weights, 1K context: verify(64) default, then with
#   --xla_gpu_exhaustive_tiling_search=true --xla_gpu_per_fusion_autotune_cache_dir=/tmp/ka/cache
# Predicted: default 21.2 +- 0.3 ms; exhaustive: compiles in 150-400 s, gemms 0.3-1.5 ms faster (most of it in the
# 6144 x 5120 projections). If it saves >= 0.5 ms, the next step is shipping the tuned configs
# (--xla_gpu_load_autotune_results_from) and timing whole rounds with them.
# JAXSPEC_COMMIT=<hash> bash bench/next/k_autotune.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda
export JAXSPEC_COMMIT=${JAXSPEC_COMMIT:?}
W=/tmp/ka; mkdir -p $W/cache
trap '(cd $W && tar czf $OUT/ka.tgz .); cat $W/compare.txt 2>/dev/null; grep -h "rc=" $W/*.log' EXIT
run() {  # name limit [XLA flags]
  mkdir -p $W/$1
  XLA_FLAGS="$3" timeout $2 python -m bench.verify_profile --config real --nodes 64 --tree --out $W/$1 > $W/$1.log 2>&1
  echo "verify_profile $1 rc=$?" >> $W/$1.log
}
run default 90
run exhaustive 430 "--xla_gpu_exhaustive_tiling_search=true --xla_gpu_per_fusion_autotune_cache_dir=$W/cache"
python - <<'PY' > $W/compare.txt 2>&1
import json, os
for name in ("default", "exhaustive"):
    f = f"/tmp/ka/{name}/verify-tree64.json"
    if not os.path.exists(f):
        print(f"{name:10s} no profile (see {name}.log)"); continue
    d = json.load(open(f))
    print(f"{name:10s} kernel {d['kernel_ms_per_step']:.3f} ms  gemms {d['gemm_ms_per_step']:.3f}  "
          f"kernels {d['kernels_per_step']:.0f}  compile {d.get('compile')}")
    for k in d["top_kernels"][:8]:
        print(f"    {k['ms_per_step']:6.3f} ms  x{k['count_per_step']:.0f}  {(k.get('gb_per_step') or 0):6.2f} GB  "
              f"{k['kernel'][:40]}  {(k.get('op_name') or '')[:50]}")
PY
