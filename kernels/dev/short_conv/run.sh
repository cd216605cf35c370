#!/bin/bash
# Device-machine driver (run from the repository root): bash kernels/dev/short_conv/run.sh
# Builds conv_variants.cu with production's kernels/short_conv.cu (nvcc alone), ptxas report in
# $OUT/build.txt, then the bitwise test of every variant against production and the bench
# (median of 50 CUDA-event timings per variant). BUILD_ONLY=1: build only (no GPU needed).
O=${OUT:-/tmp/conv_out}
mkdir -p "$O"
rm -f /tmp/conv_variants
NV="nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib $EXTRA_NVFLAGS"
t0=$(date +%s)
$NV -Xptxas -v kernels/dev/short_conv/conv_variants.cu kernels/short_conv.cu -o /tmp/conv_variants > "$O/build.txt" 2>&1
echo "build: $(($(date +%s) - t0)) s"
grep -E "error|warning" "$O/build.txt" | head
grep -A1 -E "Compiling entry function '_ZN[^']*conv" "$O/build.txt" | grep -oE "(conv_[a-z0-9_]+ILi[0-9ELi]+|Used [0-9]+ registers)" | paste - - | head -20
[ -x /tmp/conv_variants ] || { echo "build failed"; tail -20 "$O/build.txt"; exit 1; }
[ -n "$BUILD_ONLY" ] && exit 0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 60 /tmp/conv_variants > "$O/test.txt" 2>&1; echo "test rc $?"; grep -E "FAIL|^all" "$O/test.txt"
timeout 60 /tmp/conv_variants --bench 2>&1 | tee "$O/bench.txt"
