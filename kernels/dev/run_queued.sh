#!/bin/bash
# The queued kernel experiments in one device command (each builds with nvcc alone: no prefix
# needed), logs under $OUT/<name>/:
#   bash kernels/dev/run_queued.sh [smla] [moe] [hyper]      (default: all)
#   smla:  production's sparse MLA (kernels/dev/sparse_mla/run.sh: tested against fp64, benched; a
#          variant file given to run.sh is built in its place and run the same way)
#   moe:   kernels/dev/moe_gemm: production's expert GEMMs (every loader's test grid vs fp64, with and
#          without the 2-CTA clusters; bench vs cuBLAS and clusters off / on)
#   hyper: kernels/dev/hyper: mHC's fused post + projection with the coefficients in its epilogue and a
#          streaming collapse, vs production's hc_post_proj + hc_pre (bitwise), production vs fp64
O=${OUT:-/tmp/exp}
parts=${*:-smla moe hyper}
for p in $parts; do
  mkdir -p "$O/$p"
  t0=$(date +%s)
  case $p in
    smla) OUT=$O/smla timeout 400 bash kernels/dev/sparse_mla/run.sh ;;
    moe) OUT=$O/moe timeout 380 bash kernels/dev/moe_gemm/run_device.sh ;;
    hyper) OUT=$O/hyper timeout 300 bash kernels/dev/hyper/run.sh ;;
    *) echo "unknown part $p" ;;
  esac
  echo "== $p: rc $? in $(($(date +%s) - t0)) s"
done
