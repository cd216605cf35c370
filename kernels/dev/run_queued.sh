#!/bin/bash
# The queued kernel experiments in one device command (each builds with nvcc alone: no prefix
# needed), logs under $OUT/<name>/:
#   bash kernels/dev/run_queued.sh [smla] [moe]      (default: both)
#   smla:  kernels/dev/sparse_mla/sparse_mla_wgmma_idx.cu (the gathers' address loads pipelined),
#          tested against fp64 and benched beside production
#   moe:   kernels/dev/moe_gemm (production's expert GEMMs: every loader's test grid vs fp64, bench vs cuBLAS)
O=${OUT:-/tmp/exp}
parts=${*:-smla moe}
for p in $parts; do
  mkdir -p "$O/$p"
  t0=$(date +%s)
  case $p in
    smla) OUT=$O/smla timeout 400 bash kernels/dev/sparse_mla/run.sh kernels/dev/sparse_mla/sparse_mla_wgmma_idx.cu ;;
    moe) OUT=$O/moe timeout 300 bash kernels/dev/moe_gemm/run_device.sh ;;
    *) echo "unknown part $p" ;;
  esac
  echo "== $p: rc $? in $(($(date +%s) - t0)) s"
done
