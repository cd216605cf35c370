#!/bin/bash
# Device-machine driver (run from the repository root): bash kernels/dev/hyper/run.sh [variant.cu]
# Builds test_hc_post.cu with production's kernels/hyper.cu and, when given, with a variant file in
# its place; tests each against the CPU reference (lib/ops/hyper), then benches each at
# GLM-5.3-Flash's shape (T 8192, D 4096). BUILD_ONLY=1: build only. (The projection on tensor cores
# as 3xTF32 was such a variant: production since 2026-12-05, 0.479 -> 0.381 ms.)
O=${OUT:-/tmp/hc_out}
V=${1:-}
mkdir -p "$O"
rm -f /tmp/hc_prod /tmp/hc_var
NV="nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib $EXTRA_NVFLAGS"
REF="lib/ops/hyper.cpp lib/core/linalg.cpp"
t0=$(date +%s)
$NV -Xptxas -v kernels/dev/hyper/test_hc_post.cu kernels/hyper.cu $REF -o /tmp/hc_prod > "$O/build_prod.txt" 2>&1 &
[ -n "$V" ] && $NV -Xptxas -v kernels/dev/hyper/test_hc_post.cu "$V" $REF -o /tmp/hc_var > "$O/build_var.txt" 2>&1 &
wait
echo "build: $(($(date +%s) - t0)) s"
for b in prod ${V:+var}; do
  grep -E "error" "$O/build_$b.txt" | head -5
  grep -A2 "post_coeff4" "$O/build_$b.txt" | grep -oE "Used [0-9]+ registers|[0-9]+ bytes spill stores" | paste - - | sed "s/^/$b: /"
  [ -x /tmp/hc_$b ] || { echo "build $b failed"; tail -20 "$O/build_$b.txt"; exit 1; }
done
[ -n "$BUILD_ONLY" ] && exit 0
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 120 /tmp/hc_prod | sed "s/^/prod: /"
[ -n "$V" ] && timeout 120 /tmp/hc_var | sed "s/^/var: /"
for r in 1 2; do
  timeout 60 /tmp/hc_prod --bench | grep bench | sed "s/^/prod: /"
  [ -n "$V" ] && timeout 60 /tmp/hc_var --bench | grep bench | sed "s/^/var: /"
done
