#!/bin/bash
# On the GPU machine, from the repository root: production's linear-attention prefill against a queued
# patch of kernels/linear_attn_mma.cu, in one command. Builds the dev harness (test_linear_attn.cu)
# twice in parallel, once with production's file and once with the patched copy (the patch applied in
# $B/var, the includes resolved through -Ikernels), runs each one's test against the CPU reference
# (production's --quick; the patch's whole, QUICK=1: --quick), then the bench of each twice,
# alternately (v4 rows only; the v3 rows are the same code in both). ~5 min on an H100 / H200 with 16
# cores: one device command with nothing else.   bash kernels/dev/linear_attn/ab.sh PATCH [PATCH ...]
# (several: applied in order, each on the one before: a follow-up kept as its own delta)
# AB_VAR_ENVS="A=1 A=2": the patched build benched once per assignment in each repeat (rows
# "var[A=1]#1: ..."), for a patch with a run-time choice; AB_REPS: repeats (2); AB_SKIP_BASE_TEST=1:
# no test of production (its cases run in the GPU tests), for a short device command.
[[ $# -ge 1 ]] || { echo "ab: a patch of kernels/linear_attn_mma.cu (or several, in order)"; exit 2; }
O=${OUT:-/tmp/la_ab}
B=${BUILD_DIR:-/tmp/la_ab_build}
mkdir -p "$O" "$B/var"
cp kernels/linear_attn_mma.cu "$B/var/linear_attn_mma.cu"
for P in "$@"; do
  (cd "$B/var" && patch -s linear_attn_mma.cu) < <(sed -n '/^--- a\/kernels\/linear_attn_mma.cu/,$p' "$P") ||
    { echo "ab: $P does not apply to kernels/linear_attn_mma.cu (after the patches before it)"; exit 1; }
done
D=kernels/dev/linear_attn
NV="nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Ikernels -Ilib"
build() {  # $1 = name, $2 = the prefill source
  local d=$B/$1 objs=
  mkdir -p "$d"
  for s in $D/test_linear_attn.cu $D/linear_attn_fp32.cu $D/linear_attn_split.cu kernels/linear_attn.cu \
           kernels/linear_attn_tiled.cu "$2" lib/ops/linear_attn.cpp lib/ops/norm.cpp lib/core/linalg.cpp; do
    objs="$objs $d/$(basename "$s").o"
    $NV -Xptxas -v -c "$s" -o "$d/$(basename "$s").o" >"$d/$(basename "$s").log" 2>&1 &
  done
  wait
  $NV $objs -o "$d/la" >"$d/link.log" 2>&1
  grep -h -A2 "mma_prep_kernel" "$d/linear_attn_mma.cu.log" | grep -E "registers|spill" >"$O/ptxas_$1.txt"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
build base kernels/linear_attn_mma.cu &
build var "$B/var/linear_attn_mma.cu" &
wait
echo "builds: $(($(date +%s) - t0)) s"
for v in base var; do
  [ -x "$B/$v/la" ] || { echo "ab: $v did not build"; grep -h error "$B/$v"/*.log | head -20; exit 1; }
done
# AB_WAIT_FILE: wait for it before the tests and benches (a build of the project run beside the two
# harness builds in the same device command must not share the GPU machine's cores with the timings)
if [[ -n ${AB_WAIT_FILE:-} ]]; then
  while [[ ! -e $AB_WAIT_FILE ]]; do sleep 2; done
  echo "waited for $AB_WAIT_FILE: $(($(date +%s) - t0)) s after the builds began"
fi
for v in base var; do  # production's own cases ran in its GPU tests: --quick for it, all for the patch
  [[ $v == base && ${AB_SKIP_BASE_TEST:-0} == 1 ]] && continue
  t0=$(date +%s)
  q=${QUICK:+--quick}
  [[ $v == base ]] && q=--quick
  timeout ${TEST_TIMEOUT:-90} "$B/$v/la" $q >"$O/test_$v.txt" 2>&1
  echo "$v test rc $? in $(($(date +%s) - t0)) s: $(tail -1 "$O/test_$v.txt")"
  grep FAIL "$O/test_$v.txt" | head -10
done
for rep in $(seq "${AB_REPS:-2}"); do
  timeout ${BENCH_TIMEOUT:-50} "$B/base/la" --bench 2>&1 | grep -E "v4|H100|H200" | sed "s/^/base#$rep: /" | tee -a "$O/bench.txt"
  for e in ${AB_VAR_ENVS:--}; do
    if [[ $e == - ]]; then side=var; else side="var[$e]"; fi
    env ${e#-} timeout ${BENCH_TIMEOUT:-50} "$B/var/la" --bench 2>&1 | grep -E "v4|H100|H200" |
      sed "s/^/$side#$rep: /" | tee -a "$O/bench.txt"
  done
done
