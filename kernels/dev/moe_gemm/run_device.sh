#!/bin/bash
# On the GPU machine: build, test, bench (and, given a second kernel source, test and bench that
# too as a comparison). Logs under $OUT.  usage: bash kernels/dev/moe_gemm/run_device.sh [other_kernel.cu]
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
NV="nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib"
# the objects in parallel (moe_gemm.cu alone takes ~1.5 min); backend_ops.cu for gather_rows
$NV -c kernels/dev/moe_gemm/test_moe_gemm.cu -o /tmp/mg_test.o > $OUT/build_test.txt 2>&1 &
$NV -c kernels/backend_ops.cu -o /tmp/mg_ops.o > $OUT/build_ops.txt 2>&1 &
$NV -Xptxas -v -c kernels/moe_gemm.cu -o /tmp/mg_gemm.o > $OUT/build.txt 2>&1 &
if [ -n "$1" ]; then $NV -Xptxas -v -c "$1" -o /tmp/mg_other.o > $OUT/build_other.txt 2>&1 & fi
wait
cat $OUT/build_test.txt $OUT/build_ops.txt
$NV /tmp/mg_test.o /tmp/mg_ops.o /tmp/mg_gemm.o -lcublas -lcuda -o /tmp/mg >> $OUT/build.txt 2>&1
if [ -n "$1" ]; then $NV /tmp/mg_test.o /tmp/mg_ops.o /tmp/mg_other.o -lcublas -lcuda -o /tmp/mg_other >> $OUT/build_other.txt 2>&1; fi
[ -x /tmp/mg ] || { cat $OUT/build.txt; exit 1; }
grep -oE "k_moe_gemmILb.ELi.E|Used [0-9]+ registers|[0-9]+ bytes spill stores" $OUT/build.txt | paste - - - | sort -u
timeout ${TEST_TIMEOUT:-150} /tmp/mg > $OUT/test.txt 2>&1; echo "test rc $?"; grep -v "^ok" $OUT/test.txt
timeout 45 /tmp/mg --bench 2>&1 | tee $OUT/bench.txt
if [ -n "$1" ] && [ -x /tmp/mg_other ]; then
  echo "=== comparison: $1 ==="
  grep -oE "k_moe_gemmILb.ELi.E|Used [0-9]+ registers|[0-9]+ bytes spill stores|C75[0-9]+" $OUT/build_other.txt | paste - - - | sort -u
  timeout 80 /tmp/mg_other > $OUT/test_other.txt 2>&1; echo "test ($1) rc $?"; grep -v "^ok" $OUT/test_other.txt | head -20
  timeout 45 /tmp/mg_other --bench 2>&1 | tee $OUT/bench_other.txt | grep -E "TFLOP|spot"
fi
