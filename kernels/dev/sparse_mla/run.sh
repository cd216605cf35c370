#!/bin/bash
# Device-machine driver for the wgmma sparse-MLA experiment (run from the repository root):
#   bash kernels/dev/sparse_mla/run.sh
# builds test_sparse_mla.cu against sparse_mla_wgmma.cu (+ the production kernel it falls back to),
# runs the test (every case against fp64), then the bench with spot checks, and the production
# kernel's bench (DZ_SMLA_BASE=1) in the same command for the ratio.
O=${OUT:-/tmp/smla_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/sparse_mla/test_sparse_mla.cu \
  kernels/dev/sparse_mla/sparse_mla_wgmma.cu -Xptxas -v -o /tmp/smla >"$O/build.txt" 2>&1 ||
  { grep -E "error" "$O/build.txt" | head; exit 1; }
grep -E "C75|smla_wgmma|registers|spill" "$O/build.txt" | grep -A2 "smla_wgmma\|C75" | head -8
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-120} /tmp/smla >"$O/test.txt" 2>&1
echo "test rc $? in $(($(date +%s) - t0)) s"
cat "$O/test.txt" | tail -10
echo "== wgmma"
timeout 120 /tmp/smla --bench 2>&1 | tee "$O/bench_wgmma.txt"
echo "== production (DZ_SMLA_BASE=1)"
DZ_SMLA_BASE=1 timeout 120 /tmp/smla --bench --nocheck 2>&1 | tee "$O/bench_base.txt"
