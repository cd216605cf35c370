#!/usr/bin/env bash
# The queued GPU work in three device commands of <= 600 s each (docs/perf/README.md lists what is
# queued and why). From the repository root on the GPU node, with .dev/ from scripts/device-bundle.sh
# carried; logs under $OUT. Each stage hands its verdicts to the next through /tmp on the same warm
# machine (a fresh machine has none: the next stage then applies nothing queued):
#   bash scripts/device-queue.sh experiments   the KDA / GDN prep's block inverse A/B
#                                              (kernels/dev/linear_attn/ab.sh, ab_summary.py --wins)
#                                              with the project's GPU build beside its compiles, then
#                                              the wgmma indexer's test and bench (kernels/dev/indexer)
#   DZ_COMMIT=<hash> bash scripts/device-queue.sh tests
#                                              the GPU tests (Catch binary, then the CLI part in what is
#                                              left) with kernels/dev/queued/device_exchanges.patch and
#                                              each experiment's production patch that passed / won
#                                              (la_prep_blockinv.patch, indexer_wgmma_prod.patch)
#   DZ_COMMIT=<hash> bash scripts/device-queue.sh combined
#                                              when one command is all the budget allows: the indexer
#                                              test first (its patch taken if it passes), the build
#                                              with device_exchanges, the indexer bench, then the
#                                              Catch binary and the CLI part in what is left
#   DZ_COMMIT=<hash> bash scripts/device-queue.sh e2e-glm
#                                              GLM-5.3-Flash 4 layers at T = 8192: dayzero (median of 7),
#                                              the transformers 5.23 + fla anchor, dayzero again
# The tree's own changes are not touched: the patches are applied to the device's copy only.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
O=${OUT:?set OUT}
T0=$(date +%s)
left() { echo $((${DZ_STAGE_BUDGET:-575} - ($(date +%s) - T0))); }
# git apply --check first: a patch that is already in (or does not apply) is said, not forced
take() {
  if command -v git >/dev/null; then
    if git apply --check "$1" 2>/dev/null; then git apply "$1" && echo "$(basename "$1") applied"; return; fi
  elif patch -p1 -N -s --dry-run <"$1" >/dev/null 2>&1; then
    patch -p1 -N -s <"$1" && echo "$(basename "$1") applied"; return
  fi
  echo "$(basename "$1") does not apply here (already in?)"
}
# the verdicts a stage leaves for the next: the indexer test's (DIR/test.txt) and the prep A/B's
idx_passed() { grep -q "^0 of [0-9]* cases failed" "$1/test.txt" 2>/dev/null; }
prep_won() {
  [[ -f $1/test_var.txt ]] && tail -1 "$1/test_var.txt" | grep -q "^passed" &&
    python3 kernels/dev/linear_attn/ab_summary.py "$1/bench.txt" --wins >/dev/null
}
build_project() {  # $1: the log
  DZ_TARGETS="dayzero dz_gpu_tests" bash scripts/offline-prefix.sh build "$PREFIX" build-gpu >"$1" 2>&1
  echo "build rc $? at $(($(date +%s) - T0)) s" >>"$1"
}
# the GPU tests' Catch binary, then the CLI part in what is left of the stage
gpu_tests() {
  # (the device tool returns at most 8 files: the scripts' own output stays in /tmp)
  local L
  L=$(left)
  [[ $L -gt 300 ]] && L=300
  DZ_GPU_SKIP_CRASH=1 DZ_GPU_PART=catch timeout "$L" bash scripts/gpu-tests.sh "$PREFIX" build-gpu "$O/logs" >/tmp/catch.out 2>&1
  echo "catch rc $? at $(($(date +%s) - T0)) s"
  tail -3 /tmp/catch.out
  grep -h -E "^test cases|FAILED" "$O"/logs/gpu_tests*.log | head -20
  L=$(left)
  echo "cli with $L s left"
  DZ_GPU_SKIP_CRASH=1 DZ_GPU_PART=cli timeout "$L" bash scripts/gpu-tests.sh "$PREFIX" build-gpu "$O/logs" >/tmp/cli.out 2>&1
  echo "cli rc $? at $(($(date +%s) - T0)) s"
  grep -E "FAILED|rror" "$O/logs/cli.log" | head
  tail -3 /tmp/cli.out
}
# shellcheck disable=SC1091
source scripts/device-unpack.sh >/dev/null
case ${1:?stage: experiments, tests, combined or e2e-glm} in
  experiments)
    rm -f /tmp/built
    (build_project "$O/build.log"; touch /tmp/built) &
    AB_WAIT_FILE=/tmp/built bash kernels/dev/run_queued.sh laprep
    wait
    tail -2 "$O/build.log"
    cat "$O"/laprep/ptxas_*.txt
    python3 kernels/dev/linear_attn/ab_summary.py "$O/laprep/bench.txt" --wins
    rm -rf /tmp/laprep_result && cp -r "$O/laprep" /tmp/laprep_result
    L=$(left)
    echo "idx with $L s left"
    if [[ $L -gt 60 ]]; then
      OUT=$O/idx TEST_TIMEOUT=120 timeout "$L" bash kernels/dev/indexer/run.sh
      rm -rf /tmp/idx_result && cp -r "$O/idx" /tmp/idx_result
    fi
    ;;
  tests)
    export DZ_COMMIT=${DZ_COMMIT:?}
    take kernels/dev/queued/device_exchanges.patch
    if prep_won /tmp/laprep_result; then
      take kernels/dev/queued/la_prep_blockinv.patch
    else
      echo "la_prep_blockinv.patch not applied (no passing, winning A/B on this machine)"
    fi
    if idx_passed /tmp/idx_result; then
      take kernels/dev/queued/indexer_wgmma_prod.patch
    else
      echo "indexer_wgmma_prod.patch not applied (no passing indexer test on this machine)"
    fi
    gpu_tests
    ;;
  combined)
    export DZ_COMMIT=${DZ_COMMIT:?}
    OUT=$O/idx TEST_TIMEOUT=90 SKIP_BENCH=1 timeout 150 bash kernels/dev/indexer/run.sh
    idx_passed "$O/idx" && take kernels/dev/queued/indexer_wgmma_prod.patch
    take kernels/dev/queued/device_exchanges.patch
    build_project /tmp/build.log
    tail -3 /tmp/build.log
    timeout 90 /tmp/idx_build/idx --bench 2>&1 | tee "$O/idx/bench.txt"
    gpu_tests
    ;;
  e2e-glm)
    export DZ_COMMIT=${DZ_COMMIT:?}
    eval "$(bash scripts/offline-prefix.sh env "$PREFIX")"
    [[ -x build-gpu/dayzero ]] || DZ_TARGETS=dayzero bash scripts/offline-prefix.sh build "$PREFIX" build-gpu | tail -2
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
    # the anchor script's 2026 set without its Qwen3.5 half
    sed 's/^    bench("qwen3_5_35b_a3b"/    if 0: bench("qwen3_5_35b_a3b"/' "$ANCHOR" >/tmp/anchor_glm.py
    g() {
      build-gpu/dayzero bench e2e --model configs/bench/glm5_3_flash_4l --tokens 8192 --modes last-logits \
        --repeats 7 --json "$O/e2e_dayzero_2026_glm_${DZ_COMMIT}_$1.json" 2>&1 | grep -v '^{' | tail -3
    }
    g before
    PYTHONPATH=$FLA:$TF523 timeout "$(left)" python3 /tmp/anchor_glm.py "$O/e2e_transformers_2026_glm_${DZ_COMMIT}.json" 2026 2>&1 |
      grep -v Warning | tail -3
    g after
    ;;
  *) echo "unknown stage $1"; exit 2 ;;
esac
