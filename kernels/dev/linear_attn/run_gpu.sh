#!/bin/bash
# Device-machine driver for the earlier linear-attention prefill versions' test + bench (run from
# the repository root):  bash kernels/dev/linear_attn/run_gpu.sh
# Builds test_linear_attn.cu with the dev kernels (v1, v3), the library's linear-attention kernels
# (v4, the transitions kernel that is v2, the merge) and the CPU reference (lib/ops), one nvcc per
# source in parallel then the link (the same as the one nvcc line in test_linear_attn.cu);
# ptxas report in $OUT/build.txt. Then the test (v1-v3 and the v2/v3 parallel scans against the
# CPU reference and v4) and the bench (v3 against v4). BUILD_ONLY=1: stop after the build (no GPU
# needed); QUICK=1: the test's --quick subset.
O=${OUT:-/tmp/la_out}
B=${BUILD_DIR:-/tmp/la_build}
mkdir -p "$O" "$B"
rm -f "$B/la"  # no stale binary after a failed build
D=kernels/dev/linear_attn
NV="nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib $EXTRA_NVFLAGS"  # EXTRA_NVFLAGS: e.g. -lineinfo (profile.sh)
SRC="$D/test_linear_attn.cu $D/linear_attn_fp32.cu $D/linear_attn_split.cu kernels/linear_attn.cu
     kernels/linear_attn_tiled.cu kernels/linear_attn_mma.cu lib/ops/linear_attn.cpp lib/ops/norm.cpp lib/core/linalg.cpp"
[ -n "$BUILD_ONLY" ] || nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
objs=
for s in $SRC; do
  obj=$B/$(basename "$s").o
  objs="$objs $obj"
  $NV -Xptxas -v -c "$s" -o "$obj" >"$B/$(basename "$s").log" 2>&1 &
done
wait
cat "$B"/*.log >"$O/build.txt"
$NV $objs -o "$B/la" >>"$O/build.txt" 2>&1
echo "build: $(($(date +%s) - t0)) s"
grep -E "error|warning" "$O/build.txt" | head -20
grep -E "[1-9][0-9]* bytes spill stores" "$O/build.txt" | sort | uniq -c | head -5
[ -x "$B/la" ] || { echo "build failed"; tail -30 "$O/build.txt"; exit 1; }
[ -n "$BUILD_ONLY" ] && exit 0
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-60} "$B/la" ${QUICK:+--quick} >"$O/test.txt" 2>&1
echo "test rc $? in $(($(date +%s) - t0)) s"
grep FAIL "$O/test.txt" | head -20
tail -1 "$O/test.txt"
t0=$(date +%s)
timeout ${BENCH_TIMEOUT:-40} "$B/la" --bench 2>&1 | tee "$O/bench.txt"
echo "bench rc ${PIPESTATUS[0]} in $(($(date +%s) - t0)) s"
