#!/bin/bash
# Device-machine driver for the warp-specialised flash-attention experiment (run from the repository
# root): bash kernels/dev/flash_attn/run_ws.sh
# builds the harness against flash_attention_ws.cu (+ the production wgmma kernel it falls back to),
# runs the full test (every shape of test_flash_attn.cu), then the bench with fp64 spot checks, and
# the bench of the production dispatch (DZ_FA_BASE=1) in the same command for the ratio.
O=${OUT:-/tmp/fa_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/flash_attn/test_flash_attn.cu \
  kernels/dev/flash_attn/flash_attention_ws.cu kernels/flash_attention_wgmma.cu -Xptxas -v -o /tmp/fa_ws \
  >"$O/build_ws.txt" 2>&1 || { grep -E "error" "$O/build_ws.txt" | head; exit 1; }
grep -E "C75|fa_ws_kernel|registers|spill" "$O/build_ws.txt" | grep -A2 "fa_ws_kernel\|C75" | head -8
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-90} /tmp/fa_ws >"$O/test_ws.txt" 2>&1
echo "test rc $? in $(($(date +%s) - t0)) s"
grep FAIL "$O/test_ws.txt" | head -10
tail -4 "$O/test_ws.txt"
echo "== warp-specialised (TMA producer, ping-pong consumers)"
timeout 60 /tmp/fa_ws --bench 2>&1 | tee "$O/bench_ws.txt"
echo "== production dispatch (DZ_FA_BASE=1: wgmma for 128 / 256, mma.sync otherwise)"
DZ_FA_BASE=1 timeout 60 /tmp/fa_ws --bench --nocheck 2>&1 | tee "$O/bench_base.txt"
