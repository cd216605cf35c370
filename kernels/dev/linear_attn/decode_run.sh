#!/bin/bash
# Device-machine driver of the decode bench (run from the repository root):
#   OUT=<dir> bash kernels/dev/linear_attn/decode_run.sh
# builds decode_bench.cu with production's kernels/linear_attn_decode.cu, writes test.txt (hashes of
# one step's outputs and state for each column block) and bench.txt (decode beside an in-place
# float4 pass over the same bytes) under $OUT (~30 s).
O=${OUT:-/tmp/dec_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib -Xptxas -v kernels/dev/linear_attn/decode_bench.cu \
  kernels/linear_attn_decode.cu -o /tmp/dec_bench >"$O/build.txt" 2>&1 || { grep error "$O/build.txt"; exit 1; }
grep -A2 "decode_kernel" "$O/build.txt" | grep -E "registers|spill" | sort | uniq -c
timeout ${TEST_TIMEOUT:-60} /tmp/dec_bench --test | tee "$O/test.txt"
timeout 60 /tmp/dec_bench | tee "$O/bench.txt"
