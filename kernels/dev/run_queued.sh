#!/bin/bash
# The queued kernel experiments in one device command (each builds with nvcc alone: no prefix
# needed), logs under $OUT/<name>/:
#   bash kernels/dev/run_queued.sh [norms] [lse] [moe]      (default: all three)
#   norms: kernels/dev/norms/ (vectorised norms / adds; test vs fp64 + bench beside production)
#   lse:   kernels/dev/lm_head/lse_onepass.cu (the LM head's max / sum-exp / target in one pass)
#   moe:   kernels/dev/moe_gemm/moe_gemm_ws.cu (warp specialised + tail skip + staged epilogue,
#          tested and benched beside production)
O=${OUT:-/tmp/exp}
parts=${*:-norms lse moe}
for p in $parts; do
  mkdir -p "$O/$p"
  t0=$(date +%s)
  case $p in
    norms) OUT=$O/norms timeout 240 bash kernels/dev/norms/run.sh ;;
    lse)
      nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/lm_head/lse_onepass.cu \
        kernels/backend_ops.cu -o /tmp/lse >"$O/lse/build.txt" 2>&1 || { tail -5 "$O/lse/build.txt"; continue; }
      timeout 60 /tmp/lse 2>&1 | tee "$O/lse/test.txt" | tail -6
      timeout 60 /tmp/lse --bench 2>&1 | tee "$O/lse/bench.txt" ;;
    moe) OUT=$O/moe timeout 300 bash kernels/dev/moe_gemm/run_device.sh kernels/dev/moe_gemm/moe_gemm_ws.cu ;;
    *) echo "unknown part $p" ;;
  esac
  echo "== $p: rc $? in $(($(date +%s) - t0)) s"
done
