#!/bin/bash
# Device-machine driver of the wgmma indexer experiment (run from the repository root):
#   bash kernels/dev/indexer/run.sh
# builds test_indexer_wgmma.cu with kernels/indexer_wgmma.cu and production's
# kernels/indexer.cu, runs the test (every score against fp64, the Top-K selections), then the
# bench beside production (~2 min on an H100 / H200 with 16 cores).
O=${OUT:-/tmp/idx_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
NV="nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib"
B=/tmp/idx_build
mkdir -p $B
t0=$(date +%s)
for s in kernels/dev/indexer/test_indexer_wgmma.cu kernels/indexer_wgmma.cu kernels/indexer.cu; do
  $NV -Xptxas -v -c $s -o $B/$(basename $s).o >$B/$(basename $s).log 2>&1 &
done
wait
$NV $B/*.o -o $B/idx >$B/link.log 2>&1 || { cat $B/*.log | grep -E "error" | head -20; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
grep -A2 "idx_wgmma_kernel" $B/indexer_wgmma.cu.log | grep -E "registers|spill" | sort | uniq -c
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-150} $B/idx >"$O/test.txt" 2>&1
echo "test rc $? in $(($(date +%s) - t0)) s"
cat "$O/test.txt" | tail -14
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0  # (a caller that benches later, e.g. after another build)
timeout ${BENCH_TIMEOUT:-150} $B/idx --bench 2>&1 | tee "$O/bench.txt"
