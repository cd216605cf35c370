#!/bin/bash
# Device-machine A/B of several sparse-MLA variants in one command (run from the repository root):
#   bash kernels/dev/sparse_mla/compare.sh variant.cu ...
# builds production (kernels/sparse_mla_wgmma.cu) and every variant in its place in parallel, runs
# the fp64 test of each, then the bench of each in ROUNDS rounds (default 2), round-robin, so that
# the clocks' drift falls on all of them alike.
O=${OUT:-/tmp/smla_cmp}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
B="nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/sparse_mla/test_sparse_mla.cu kernels/sparse_mla.cu"
srcs=(kernels/sparse_mla_wgmma.cu "$@")
for i in "${!srcs[@]}"; do $B "${srcs[$i]}" -Xptxas -v -o /tmp/smla_$i > "$O/build_$i.txt" 2>&1 & done
wait
for i in "${!srcs[@]}"; do
  if [ ! -x /tmp/smla_$i ]; then echo "[$i] ${srcs[$i]}: build failed"; grep error "$O/build_$i.txt" | head -3; continue; fi
  timeout ${TEST_TIMEOUT:-60} /tmp/smla_$i > "$O/test_$i.txt" 2>&1
  echo "[$i] ${srcs[$i]}: test rc $? ($(grep -c ' ok$' "$O/test_$i.txt") ok, $(tail -1 "$O/test_$i.txt"))"
done
for r in $(seq ${ROUNDS:-2}); do
  for i in "${!srcs[@]}"; do
    [ -x /tmp/smla_$i ] && timeout 60 /tmp/smla_$i --bench 2>&1 | grep "^bench" | sed "s|^|[$i] r$r |"
  done
done | tee "$O/bench.txt"
