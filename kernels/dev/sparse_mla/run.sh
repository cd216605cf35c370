#!/bin/bash
# Device-machine driver for the sparse-MLA test + bench (run from the repository root):
#   bash kernels/dev/sparse_mla/run.sh
# builds test_sparse_mla.cu against kernels/sparse_mla.cu + sparse_mla_wgmma.cu, runs the test
# (every case against fp64), then the bench with spot checks.
O=${OUT:-/tmp/smla_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/sparse_mla/test_sparse_mla.cu \
  kernels/sparse_mla.cu kernels/sparse_mla_wgmma.cu -Xptxas -v -o /tmp/smla >"$O/build.txt" 2>&1 ||
  { grep -E "error" "$O/build.txt" | head; exit 1; }
grep -E "C75|sparse_mla_wgmma|registers|spill" "$O/build.txt" | grep -A2 "sparse_mla_wgmma\|C75" | head -8
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-120} /tmp/smla >"$O/test.txt" 2>&1
echo "test rc $? in $(($(date +%s) - t0)) s"
cat "$O/test.txt" | tail -10
timeout 120 /tmp/smla --bench 2>&1 | tee "$O/bench.txt"
