#!/bin/bash
# On the GPU machine, from the repository root: build the fused up-GEMM + activation experiment
# (moe_gemm_glu.cu, in production moe_gemm.cu's place), print the plain kernels' registers / spills
# and any wgmma serialisation warning (C75xx), run the bitwise test, then the bench (uniform routing,
# then the GLM-5.3-Flash rows file). Logs under $OUT.  usage: bash kernels/dev/moe_gemm/run_glu_epi.sh
set -o pipefail
OUT=${OUT:-/tmp/glu_out}
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/moe_gemm/test_glu_epi.cu \
  kernels/dev/moe_gemm/moe_gemm_glu.cu kernels/backend_ops.cu -lcublas -Xptxas -v -o /tmp/glu_epi > $OUT/build.txt 2>&1
rc=$?
[ $rc -eq 0 ] && [ -x /tmp/glu_epi ] || { grep -E "error|warning" $OUT/build.txt | head -40; echo "build failed ($rc)"; exit 1; }
echo "--- registers / spills (k_moe_gemm_ws<b,CL,GIN>, k_moe_gemm_swab<GIN>) ---"
awk '/Compiling entry function/ { k = ""; if (match($0, /k_moe_gemm[a-z_]*I[A-Za-z0-9]*E/)) k = substr($0, RSTART, RLENGTH) }
     /spill stores/ && k != "" { sp = $5 " bytes spill stores" }
     /Used [0-9]+ registers/ && k != "" { print k, $5, "registers,", sp; k = "" }' $OUT/build.txt | sort -u
echo "C75xx warnings: $(grep -c 'C75[0-9][0-9]' $OUT/build.txt)"
grep 'C75[0-9][0-9]' $OUT/build.txt | head -5
timeout 120 /tmp/glu_epi > $OUT/test.txt 2>&1
echo "test rc $?"
grep -vE "^ok|^---" $OUT/test.txt | head -40
timeout 60 /tmp/glu_epi --bench 2>&1 | tee $OUT/bench.txt
DZ_BENCH_ROWS=kernels/dev/moe_gemm/rows_glm5_3_flash_dummy_T8192.txt timeout 60 /tmp/glu_epi --bench 2>&1 | tee $OUT/bench_rows.txt
