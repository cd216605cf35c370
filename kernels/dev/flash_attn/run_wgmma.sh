#!/bin/bash
# Device-machine driver for the wgmma flash-attention experiment (run from the repository root):
#   bash kernels/dev/flash_attn/run_wgmma.sh
# builds the test harness against flash_attention_wgmma.cu (wgmma for 128/128 and 256/256, the
# production kernel otherwise), runs the full test (every shape of test_flash_attn.cu), then the
# bench with fp64 spot checks twice in one process environment: the wgmma kernel, and
# DZ_FA_MMA=1 (the production mma.sync kernel) for the same-command ratio.
O=${OUT:-/tmp/fa_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/flash_attn/test_flash_attn.cu \
  kernels/dev/flash_attn/flash_attention_wgmma.cu -Xptxas -v -o /tmp/fa3 >"$O/build_wgmma.txt" 2>&1 ||
  { grep -E "error" "$O/build_wgmma.txt" | head; exit 1; }
grep -E "C75|k_fa3|registers|spill" "$O/build_wgmma.txt" | grep -A2 k_fa3 | head -8
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-90} /tmp/fa3 >"$O/test_wgmma.txt" 2>&1
echo "test rc $? in $(($(date +%s) - t0)) s"
grep FAIL "$O/test_wgmma.txt" | head -10
tail -4 "$O/test_wgmma.txt"
echo "== wgmma"
timeout 60 /tmp/fa3 --bench 2>&1 | tee "$O/bench_wgmma.txt"
echo "== mma.sync (DZ_FA_MMA=1)"
DZ_FA_MMA=1 timeout 60 /tmp/fa3 --bench --nocheck 2>&1 | tee "$O/bench_mma.txt"
