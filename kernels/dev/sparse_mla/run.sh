#!/bin/bash
# Device-machine driver for the sparse-MLA test + bench (run from the repository root):
#   bash kernels/dev/sparse_mla/run.sh [variant.cu]
# builds test_sparse_mla.cu against kernels/sparse_mla.cu + sparse_mla_wgmma.cu, runs the test
# (every case against fp64), then the bench with spot checks; given a variant of
# sparse_mla_wgmma.cu (kernels/dev/sparse_mla/), builds it in production's place and tests and
# benches it the same way in the same command, then compares the two builds' outputs bitwise.
O=${OUT:-/tmp/smla_out}
mkdir -p "$O"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
B="nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/sparse_mla/test_sparse_mla.cu kernels/sparse_mla.cu"
$B kernels/sparse_mla_wgmma.cu -Xptxas -v -o /tmp/smla >"$O/build.txt" 2>&1 &
if [ -n "$1" ]; then $B "$1" -Xptxas -v -o /tmp/smla_var >"$O/build_var.txt" 2>&1 & fi
wait
[ -x /tmp/smla ] || { grep -E "error" "$O/build.txt" | head; exit 1; }
for v in "" _var; do
  [ -n "$v" ] && { [ -n "$1" ] || break; echo "=== variant: $1 ==="; [ -x /tmp/smla_var ] || { grep -E "error" "$O/build_var.txt" | head; break; }; }
  grep -E "C75|sparse_mla_wgmma|registers|spill" "$O/build$v.txt" | grep -A2 "sparse_mla_wgmma\|C75" | head -8
  t0=$(date +%s)
  rm -f /tmp/smla_t$v.bin /tmp/smla_b$v.bin  # outputs (DZ_SMLA_DUMP) for the bitwise compare below
  DZ_SMLA_DUMP=/tmp/smla_t$v.bin timeout ${TEST_TIMEOUT:-120} /tmp/smla$v >"$O/test$v.txt" 2>&1
  echo "test rc $? in $(($(date +%s) - t0)) s"
  tail -10 "$O/test$v.txt"
  DZ_SMLA_DUMP=/tmp/smla_b$v.bin timeout 120 /tmp/smla$v --bench 2>&1 | tee "$O/bench$v.txt"
done
# a variant whose arithmetic is production's must give its outputs bit for bit
if [ -n "$1" ] && [ -f /tmp/smla_t_var.bin ]; then
  cmp /tmp/smla_t.bin /tmp/smla_t_var.bin && echo "variant: test outputs bitwise equal"
  cmp /tmp/smla_b.bin /tmp/smla_b_var.bin && echo "variant: bench outputs bitwise equal"
fi
