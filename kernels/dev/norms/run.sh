#!/bin/bash
# Device-machine driver for the vectorised norms / adds experiment (run from the repository root):
#   bash kernels/dev/norms/run.sh
# builds test_norms.cu against norms_vec.cu and production backend_ops.cu, runs the test (every
# output element against fp64, production's as a control), then the bench beside production.
O=${OUT:-/tmp/norms_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/norms/test_norms.cu \
  kernels/dev/norms/norms_vec.cu kernels/backend_ops.cu -Xptxas -v -o /tmp/norms >"$O/build.txt" 2>&1 ||
  { grep -E "error" "$O/build.txt" | head; exit 1; }
grep -E "spill" "$O/build.txt" | grep -v " 0 bytes spill" | head -4
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-120} /tmp/norms >"$O/test.txt" 2>&1
echo "test rc $? in $(($(date +%s) - t0)) s"
grep -E "FAIL|declined" "$O/test.txt" | head -20
tail -1 "$O/test.txt"
timeout 120 /tmp/norms --bench 2>&1 | tee "$O/bench.txt"
