#!/bin/bash
# The queued kernel experiments in one device command (each builds with nvcc alone: no prefix
# needed), logs under $OUT/<name>/:
#   bash kernels/dev/run_experiments.sh [ws] [mc] [smla]      (default: all three)
#   ws: kernels/dev/flash_attn/flash_attention_ws.cu   (run_ws.sh: test + bench beside production)
#   mc: kernels/dev/moe_gemm/moe_gemm_mc.cu            (run_device.sh: production and experiment,
#                                                       each tested and benched)
#   smla: kernels/dev/sparse_mla/sparse_mla_wgmma.cu   (run.sh: test + bench beside production)
O=${OUT:-/tmp/exp}
parts=${*:-ws mc smla}
for p in $parts; do
  mkdir -p "$O/$p"
  t0=$(date +%s)
  case $p in
    ws) OUT=$O/ws timeout 300 bash kernels/dev/flash_attn/run_ws.sh ;;
    mc) OUT=$O/mc timeout 300 bash kernels/dev/moe_gemm/run_device.sh kernels/dev/moe_gemm/moe_gemm_mc.cu ;;
    smla) OUT=$O/smla timeout 300 bash kernels/dev/sparse_mla/run.sh ;;
    *) echo "unknown part $p" ;;
  esac
  echo "== $p: rc $? in $(($(date +%s) - t0)) s"
done
