#!/bin/bash
# The queued kernel experiments in one device command (each builds with nvcc alone: no prefix
# needed), logs under $OUT/<name>/:
#   bash kernels/dev/run_queued.sh [moe]
#   moe:   kernels/dev/moe_gemm (production's expert GEMMs: every loader's test grid vs fp64, bench vs cuBLAS)
O=${OUT:-/tmp/exp}
parts=${*:-moe}
for p in $parts; do
  mkdir -p "$O/$p"
  t0=$(date +%s)
  case $p in
    moe) OUT=$O/moe timeout 300 bash kernels/dev/moe_gemm/run_device.sh ;;
    *) echo "unknown part $p" ;;
  esac
  echo "== $p: rc $? in $(($(date +%s) - t0)) s"
done
