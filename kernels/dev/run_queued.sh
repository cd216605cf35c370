#!/bin/bash
# The queued kernel experiments in one device command (each builds with nvcc alone: no prefix
# needed), logs under $OUT/<name>/:
#   bash kernels/dev/run_queued.sh [smla] [moe] [hyper]      (default: all)
#   smla:  kernels/dev/sparse_mla/sparse_mla_wgmma_idx.cu (the gathers' address loads pipelined),
#          tested against fp64 and benched beside production
#   moe:   kernels/dev/moe_gemm: production's expert GEMMs (every loader's test grid vs fp64, with and
#          without the 2-CTA clusters; bench vs cuBLAS and clusters off / on)
#   hyper: kernels/dev/hyper: mHC's hc_pre as 3xTF32 projection + coefficient + collapse kernels vs
#          production's cuBLAS fp32 GEMM + k_hc_pre, both against fp64
O=${OUT:-/tmp/exp}
parts=${*:-smla moe hyper}
for p in $parts; do
  mkdir -p "$O/$p"
  t0=$(date +%s)
  case $p in
    smla) OUT=$O/smla timeout 400 bash kernels/dev/sparse_mla/run.sh kernels/dev/sparse_mla/sparse_mla_wgmma_idx.cu ;;
    moe) OUT=$O/moe timeout 380 bash kernels/dev/moe_gemm/run_device.sh ;;
    hyper) OUT=$O/hyper timeout 200 bash kernels/dev/hyper/run.sh ;;
    *) echo "unknown part $p" ;;
  esac
  echo "== $p: rc $? in $(($(date +%s) - t0)) s"
done
