#!/bin/bash
# Device-machine driver for the mHC hc_pre experiment (run from the repository root):
#   bash kernels/dev/hyper/run.sh
# builds test_hc_pre.cu with kernels/hyper.cu (production) and hc_pre_tc.cu, tests both against
# fp64, benches both. Logs under $OUT.
O=${OUT:-/tmp/hyper_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/hyper/test_hc_pre.cu \
  kernels/dev/hyper/hc_pre_tc.cu kernels/hyper.cu -lcublas -Xptxas -v -o /tmp/hcpre >"$O/build.txt" 2>&1 ||
  { grep -E "error" "$O/build.txt" | head; exit 1; }
grep -A2 "k_hc_proj" "$O/build.txt" | grep -E "registers|spill" | head -6
timeout 120 /tmp/hcpre >"$O/test.txt" 2>&1
echo "test rc $?"
grep -v "^ok" "$O/test.txt" | tail -8
timeout 60 /tmp/hcpre --bench 2>&1 | tee "$O/bench.txt"
