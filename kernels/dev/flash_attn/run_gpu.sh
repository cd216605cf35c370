#!/bin/bash
# Device-machine driver for the flash_attention test + bench (run from the repository root):
#   VARIANTS="1 2" TEST_VARIANTS=1 SANITIZE=1 bash kernels/dev/flash_attn/run_gpu.sh
# builds the default binary (ptxas report in $OUT/build.txt) and one per tuning variant
# (-DFA_VARIANT=n, in parallel), runs the full test, the bench with spot checks, each variant's bench
# without checks, optionally (TEST_VARIANTS=1, or =quick) each variant's test, and optionally
# (SANITIZE=1) compute-sanitizer memcheck and racecheck over the --quick test subset.
O=${OUT:-/tmp/fa_out}
mkdir -p "$O"
NV="nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib kernels/dev/flash_attn/test_flash_attn.cu kernels/flash_attention.cu kernels/flash_attention_wgmma.cu"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
$NV -Xptxas -v -o /tmp/fa >"$O/build.txt" 2>&1 &
for v in $VARIANTS; do $NV -DFA_VARIANT=$v -o /tmp/fa_v$v >"$O/build_v$v.txt" 2>&1 & done
wait
echo "build: $(($(date +%s) - t0)) s"
grep -E "error|warning" "$O"/build*.txt | head -20
grep -E "Compiling|registers|spill" "$O/build.txt" | grep -A2 "flash_attn_kernel\|fa_wgmma_kernel" |
  sed -E 's/ptxas info    : //; s/.*flash_attn_kernelINS1_3CfgIL/cfg /; s/EEEEEvNS0_13FlashAttnArgsEfi.*//' | paste - - -
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-60} /tmp/fa >"$O/test.txt" 2>&1
echo "test rc $? in $(($(date +%s) - t0)) s"
head -30 "$O/test.txt" | grep FAIL
tail -12 "$O/test.txt"
timeout 40 /tmp/fa --bench 2>&1 | tee "$O/bench.txt"
for v in $VARIANTS; do
  echo "variant $v"
  timeout 20 /tmp/fa_v$v --bench --nocheck 2>&1 | tee "$O/bench_v$v.txt"
done
if [ -n "$TEST_VARIANTS" ]; then
  for v in $VARIANTS; do
    q=; [ "$TEST_VARIANTS" = quick ] && q=--quick
    timeout ${TEST_TIMEOUT:-60} /tmp/fa_v$v $q >"$O/test_v$v.txt" 2>&1
    echo "variant $v test rc $?: $(tail -1 "$O/test_v$v.txt")"; grep FAIL "$O/test_v$v.txt" | head -3
  done
fi
if [ -n "$SANITIZE" ]; then
  t0=$(date +%s)
  timeout ${SAN_TIMEOUT:-30} compute-sanitizer --tool memcheck /tmp/fa --quick >"$O/sanitizer.txt" 2>&1
  echo "sanitizer rc $? in $(($(date +%s) - t0)) s"
  tail -3 "$O/sanitizer.txt"
  t0=$(date +%s)
  timeout ${SAN_TIMEOUT:-30} compute-sanitizer --tool racecheck /tmp/fa --quick >"$O/racecheck.txt" 2>&1
  echo "racecheck rc $? in $(($(date +%s) - t0)) s"
  tail -3 "$O/racecheck.txt"
fi
