#!/bin/bash
# #6 / the prefill (either card, one call, ~5 min): the GDN part of the 8K prefill (440-475 ms of 1146-1227 in
# session 60) with the tree delta rule's XLA form (`JAXSPEC_TREE_DELTA_RULE=xla`: batched fp32 products, a
# recursive-doubling inverse) instead of the Triton kernels, in two trees:
#   head      this tree: a scan over 64-token blocks, the op once per block
#   bp        _alt_bp/, session 59's block-parallel chain (4e73b78, reverted in session 60): the op once over all
#             of a layer's blocks with value columns [V, 0] and entering state [0, I], then a scan of state products.
#             With the Triton kernels it was slower (1256 against 1174 ms, H200): the kernels' programs are bound by
#             their serial chains, so 128 blocks in one call cost what 128 calls did. XLA's form has no such chain.
# Each with and without the flag, the 8K prefill with its profile by part, one lease:
#   mkdir _alt_bp && git archive 4e73b78 jaxspec pallas_kernels convert pyproject.toml \
#     bench/{__init__,harness,cli,profile}.py | tar -x -C _alt_bp && rm -r _alt_bp/jaxspec/demo
#   OUT=... bash bench/next/k_prefill_gdn.sh        (device call with carry: ["_alt_bp"]; writes $OUT/prefill-gdn.tgz)
#   JAX_PLATFORMS=cpu OUT=/tmp/x SMALL=1 bash bench/next/k_prefill_gdn.sh     (dry run on the tiny config)
export PYTHONPATH=. PYTHONUNBUFFERED=1 JAX_PLATFORMS=${JAX_PLATFORMS:-cuda}
OUT=${OUT:?}
W=$(mktemp -d)
trap 'tar czf $OUT/prefill-gdn.tgz -C $W .' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader > $W/gpu.txt 2>/dev/null
git log -1 --format='%h %s' > $W/commit.txt
if [ -n "$SMALL" ]; then H="--config tiny --prompt 200 --copy-gib 0.01 --matmul-n 64"; else H="--config real --prompt 8192"; fi
for v in head head-xla bp-xla bp; do
  d=.; [ ${v%-xla} = bp ] && d=_alt_bp
  F=(); [ ${v#*-} = xla ] && F=(JAXSPEC_TREE_DELTA_RULE=xla)
  (cd $d && env "${F[@]}" timeout 110 python -m bench.harness $H --contexts '' --profile-prefill \
     --out $W/prefill-$v.json > $W/prefill-$v.log 2>&1; echo "prefill $v rc=$?")
  grep -v "^WARNING: Location" $W/prefill-$v.log | grep -E "prefill P=.*(ms,|profile)|rror" | cut -c1-220 | tail -2
done
