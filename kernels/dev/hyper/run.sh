#!/bin/bash
# Device-machine driver for the mHC experiment (run from the repository root):
#   bash kernels/dev/hyper/run.sh
# builds test_hc_fused.cu with hc_fused_dev.cu and production's kernels/hyper.cu, tests the variant
# against production (bitwise) and production against fp64, then benches both. Logs under $OUT.
O=${OUT:-/tmp/hyper_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/hyper/test_hc_fused.cu \
  kernels/dev/hyper/hc_fused_dev.cu kernels/hyper.cu kernels/backend_ops.cu -Xptxas -v -o /tmp/hcfused >"$O/build.txt" 2>&1 ||
  { grep -E "error" "$O/build.txt" | head; exit 1; }
grep -A2 "k_post_proj4\|k_collapse4" "$O/build.txt" | grep -E "registers|spill" | head -8
timeout 180 /tmp/hcfused >"$O/test.txt" 2>&1
echo "test rc $?"
cat "$O/test.txt"
timeout 60 /tmp/hcfused --bench 2>&1 | tee "$O/bench.txt"
