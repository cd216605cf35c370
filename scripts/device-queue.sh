#!/usr/bin/env bash
# The GPU work of a session in device commands of <= 600 s each (docs/perf/README.md says what was
# run when). From the repository root on the GPU node, with .dev/ from scripts/device-bundle.sh
# carried; results under $OUT, the logs packed there as logs.tar.xz (the device tool returns at most 8 files):
#   DZ_COMMIT=<hash> bash scripts/device-queue.sh benches
#                                              the project's GPU build, scripts/bench-kernels-gpu.sh
#                                              (dayzero's linear / sparse / dense attention benches
#                                              beside PyTorch's SDPA and naive indexer; fla with
#                                              DZ_BENCH_FLA=1), tests/mpi/ep_equal.sh on cuda (~3 min
#                                              for its 35 layouts), then the crash scripts on cuda
#                                              (~4 min) in the time left
#   DZ_COMMIT=<hash> [DZ_SPEC=<Catch spec>] [DZ_FAMILIES="<fam> ..."] bash scripts/device-queue.sh tests
#                                              the GPU tests (Catch binary, then the CLI part in what is
#                                              left; builds what is missing), or only the cases DZ_SPEC
#                                              and the CLI runs of the families DZ_FAMILIES
#   DZ_COMMIT=<hash> [DZ_FAMILIES="<fam> ..."] [DZ_CLI=families|extras] bash scripts/device-queue.sh cli
#                                              only the CLI part of the GPU tests (builds what is
#                                              missing): the golden families' runs (only those of
#                                              DZ_FAMILIES when set) and the preset, hybrid-small and
#                                              FP8 runs after them (DZ_CLI=families / =extras: only
#                                              one of the two), for a tree whose Catch binary passed
#                                              in an earlier command; cli.log appends
#   DZ_COMMIT=<hash> DZ_PATCH=<file> DZ_HARNESS=<script> [DZ_SPEC=<Catch spec>] [DZ_FAMILIES="<fam> ..."] \
#     bash scripts/device-queue.sh patch
#                                              a queued patch (kernels/dev/queued/<name>.patch): its
#                                              harness's test and bench before and after it (OUT=<dir>
#                                              bash <script> writes test.txt / bench.txt there; "-":
#                                              none, for a patch outside the kernels), then
#                                              with it the GPU tests' cases DZ_SPEC and the CLI runs of
#                                              the families DZ_FAMILIES; DZ_BENCH_SPARSE=1: also
#                                              `bench sparse-attn` before the patch and after the tests
#                                              (DZ_BENCH_ONLY=<substring>: only those cases); DZ_PATCH may
#                                              name several patches (space-separated, applied in order);
#                                              DZ_BENCH_LA=1: `bench linear-attn` before the patch and with
#                                              it at the end (DZ_BENCH_LA_ONLY=<substring>: only those rows)
#   DZ_COMMIT=<hash> bash scripts/device-queue.sh e2e-glm
#                                              GLM-5.3-Flash 4 layers at T = 8192: dayzero (median of 7),
#                                              the transformers 5.23 + fla anchor, dayzero again
#   DZ_COMMIT=<hash> bash scripts/device-queue.sh ncu
#                                              Nsight Compute over the issue-12 kernels that miss their
#                                              targets (scripts/ncu-targets.sh: KDA / GDN prefill, the
#                                              scan at H = 8, the indexer, sparse MLA prefill and FP8
#                                              decode), one row per launch, and the SASS instructions
#                                              with the most stall samples for NCU_SOURCE (default:
#                                              the sparse-MLA FP8 decode and prefill) (~1-3 min)
#   DZ_COMMIT=<hash> [DZ_STAGE_BUDGET=<s>] [DZ_PATCH=<file> [DZ_BENCH_LA=1] [DZ_BENCH_SPARSE=1]] bash scripts/device-queue.sh final
#                                              a session's closing check in one command ending by
#                                              DZ_STAGE_BUDGET s (default 575; less when the budget is short): the
#                                              project built, the whole Catch binary (its MoE reruns
#                                              included), GLM-5.3-Flash 4l and Qwen3.5 8l e2e at T = 8192
#                                              (median of 7, no anchor), the CLI part in what is left.
#                                              DZ_PATCH: the check of the tree with queued patches applied
#                                              (what the session lands if they pass); DZ_BENCH_LA=1 adds
#                                              `bench linear-attn` before them and with them (DZ_LADDER=1:
#                                              also after each patch in turn, linear_attn_step<n>.json);
#                                              DZ_BENCH_SPARSE=1 `bench sparse-attn` before them and after
#                                              the e2e runs (sparse_attn_{before,dayzero}.json)
# On one warm machine `benches` then `tests` (within its 30 s idle release) share the build.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
O=${OUT:?set OUT}
T0=$(date +%s)
left() { echo $((${DZ_STAGE_BUDGET:-575} - ($(date +%s) - T0))); }
build_project() {  # $1: the log
  DZ_TARGETS="dayzero dz_gpu_tests" bash scripts/offline-prefix.sh build "$PREFIX" build-gpu >"$1" 2>&1
  echo "build rc $? at $(($(date +%s) - T0)) s" >>"$1"
}
# `timeout` ends the script, not the mpirun and ranks it started: end them before the GPU is used
# again (2026-12-06: an ep_equal.sh cut off at its limit went on beside the kernel benches). By
# process name, not command line: `pkill -f build-gpu/dayzero` also matched a device command that
# named that path and ended it, losing its logs (2026-12-06, nineteenth session); `pgrep -f` in a
# wait loop likewise matches the device command itself and waits out its limit (twentieth session):
# wait on the background job's pid instead.
reap() {
  pkill -x dayzero 2>/dev/null
  pkill -x mpirun 2>/dev/null
  pkill -x prterun 2>/dev/null  # Open MPI 5's launcher
  sleep 2
}
# The Catch binary of the GPU tests (the cases $2 when given), logs in $1, within what is left of the
# stage less $3 s (kept for what follows), at most 300 s.
catch_part() {
  local D=$1 spec=${2:-} L
  L=$(($(left) - ${3:-0}))
  [[ $L -gt 300 ]] && L=300
  DZ_GPU_SKIP_CRASH=1 DZ_GPU_PART=catch timeout "$L" bash scripts/gpu-tests.sh "$PREFIX" build-gpu "$D" \
    ${spec:+"$spec"} >/tmp/catch.out 2>&1
  echo "catch rc $? at $(($(date +%s) - T0)) s"
  reap
  tail -3 /tmp/catch.out
  grep -h -E "^All tests|^test cases|FAILED" "$D"/gpu_tests*.log | head -20
}
# The CLI part of the GPU tests (only the families $2 when given), logs in $1, in what is left.
cli_part() {
  local D=$1 fams=${2:-} L
  L=$(left)
  echo "cli ${fams:-(${DZ_GPU_CLI:-all})} with $L s left"
  [[ $L -gt 20 ]] || return 0
  env DZ_GPU_SKIP_CRASH=1 DZ_GPU_PART=cli ${fams:+DZ_GPU_CLI=families "DZ_GPU_FAMILIES=$fams"} timeout "$L" \
    bash scripts/gpu-tests.sh "$PREFIX" build-gpu "$D" >/tmp/cli.out 2>&1
  echo "cli rc $? at $(($(date +%s) - T0)) s"
  reap
  echo "$(grep -c " ok" "$D/cli.log") ok lines"
  grep -E "FAILED|rror" "$D/cli.log" | head
  tail -3 /tmp/cli.out
}
# The GPU tests without the crash scripts, logs in $1: the Catch binary (the cases $2 when given),
# then the CLI part in what is left of the stage (only the families $3 when given; "-": none); $4 s
# kept from the Catch binary for what follows.
gpu_tests() {
  catch_part "$1" "${2:-}" "${4:-0}"
  [[ ${3:-} == - ]] && { echo "cli skipped (families -)"; return 0; }
  cli_part "$1" "${3:-}"
}
# `bench sparse-attn` of the project's build within $1 s: JSON $2, log $3 (DZ_BENCH_ONLY=<substring>:
# only those cases); prints its indexer and sparse-MLA lines.
bench_sparse() {
  (eval "$(bash scripts/offline-prefix.sh env "$PREFIX")"
   timeout "$1" build-gpu/dayzero bench sparse-attn --json "$2" >"$3" 2>&1)
  echo "bench sparse-attn rc $? at $(($(date +%s) - T0)) s"
  grep -E -A1 "^indexer prefill|^sparse MLA" "$3"
}
# `bench linear-attn` of the project's build within $1 s, JSON $2 (DZ_BENCH_LA_ONLY=<substring>: only
# those rows; DZ_BENCH_ONLY names sparse-attn cases here); prints its chunked-prefill lines.
bench_la() {
  (eval "$(bash scripts/offline-prefix.sh env "$PREFIX")"
   DZ_BENCH_ONLY=${DZ_BENCH_LA_ONLY:-} timeout "$1" build-gpu/dayzero bench linear-attn --json "$2" 2>&1 | grep -E "chunk")
  echo "bench linear-attn rc $? at $(($(date +%s) - T0)) s"
}
# The patches $1 (space-separated) applied in order.
apply_patches() {
  local pf
  for pf in $1; do
    git apply "$pf" 2>/dev/null || patch -p1 -s <"$pf" || { echo "$pf does not apply"; return 1; }
    echo "$pf applied"
  done
}
# A queued patch ($1) and its harness ($2: OUT=<dir> bash $2 writes test.txt / bench.txt there, and
# build.txt for some): the harness before the patch, the patch applied, the harness again; then the
# project built with it, the GPU test cases $3 (Catch spec) and the CLI runs of the families $4.
# Back (8 files at most): bench_before.txt, {build,test,bench}.txt, gpu_tests.log, cli.log.
queued_ab() {
  local P=$1 H=$2 f
  (build_project /tmp/build_before.log) &  # the project's objects, most of which the patch leaves
  [[ $H == - ]] || OUT=/tmp/h_before TEST_TIMEOUT=90 timeout 200 bash "$H" >/tmp/h_before.log 2>&1
  wait
  [[ $H == - ]] || cp /tmp/h_before/bench.txt "$O/bench_before.txt"
  # the production build's `bench sparse-attn` / `bench linear-attn` before the patch
  [[ ${DZ_BENCH_SPARSE:-0} == 1 ]] && bench_sparse 150 /tmp/sparse_before.json "$O/sparse_attn_before.log"
  [[ ${DZ_BENCH_LA:-0} == 1 ]] && bench_la 120 "$O/linear_attn_before.json"
  apply_patches "$P" || return 1
  if [[ $H != - ]]; then
    OUT=/tmp/h TEST_TIMEOUT=90 timeout 200 bash "$H"
    reap
    for f in build test bench; do [[ -f /tmp/h/$f.txt ]] && cp "/tmp/h/$f.txt" "$O/"; done
  fi
  build_project /tmp/build.log
  tail -1 /tmp/build.log
  local keep=0  # the benches after the tests: ~20 s the short sparse one, ~60 s linear attention
  [[ ${DZ_BENCH_SPARSE:-0} == 1 ]] && keep=$((keep + 30))
  [[ ${DZ_BENCH_LA:-0} == 1 ]] && keep=$((keep + 80))
  gpu_tests /tmp/logs "$3" "$4" "$keep"
  cp /tmp/logs/gpu_tests.log "$O/"
  [[ -f /tmp/logs/cli.log ]] && cp /tmp/logs/cli.log "$O/"
  if [[ ${DZ_BENCH_SPARSE:-0} == 1 && $(left) -gt 40 ]]; then  # with DZ_BENCH_ONLY a short one: before LA's
    bench_sparse $(($(left) - 5)) "$O/sparse_attn_dayzero.json" "$O/sparse_attn.log"
  fi
  if [[ ${DZ_BENCH_LA:-0} == 1 && $(left) -gt 30 ]]; then  # the linear-attention bench with the patches
    bench_la $(($(left) - 5)) "$O/linear_attn_dayzero.json"
  fi
}
# DZ_COMMIT names files under $OUT: the device tool does not return a name with other characters than
# letters, digits, '.', '_' and '-' (a "c03ae4c+2p" JSON was lost, 2026-12-06), so they become '_'. Pass it
# from the submitting machine: the GPU node's copy of .git can be older than the tree it runs.
[[ -n ${DZ_COMMIT:-} ]] && DZ_COMMIT=${DZ_COMMIT//[^A-Za-z0-9._-]/_}
# shellcheck disable=SC1091
source scripts/device-unpack.sh >/dev/null
case ${1:?stage: benches, tests, cli, patch, final, e2e-glm or ncu} in
  benches)
    export DZ_COMMIT=${DZ_COMMIT:?}
    build_project /tmp/build.log
    tail -1 /tmp/build.log
    eval "$(bash scripts/offline-prefix.sh env "$PREFIX")"
    # the kernel benches first, on an idle GPU
    parts="linear sparse dense torch"
    [[ ${DZ_BENCH_FLA:-0} == 1 ]] && parts="$parts fla"
    # shellcheck disable=SC2086
    timeout "$(left)" bash scripts/bench-kernels-gpu.sh "$PREFIX" build-gpu /tmp/kernels "$FLA" $parts
    echo "kernel benches rc $? at $(($(date +%s) - T0)) s"
    # back: the JSON and the table (the logs stay in /tmp: 8 files at most)
    mkdir -p "$O/kernels" && cp /tmp/kernels/*.json /tmp/kernels/kernel_table.md "$O/kernels/"
    L=$(left)
    [[ $L -gt 200 ]] && L=200
    DZ_TEST_BACKEND=cuda timeout "$L" bash tests/mpi/ep_equal.sh build-gpu/dayzero . >"$O/ep_equal_cuda.log" 2>&1
    echo "ep_equal on cuda rc $? at $(($(date +%s) - T0)) s"
    reap
    grep -E "FAIL|all expert-parallel" "$O/ep_equal_cuda.log"
    echo "$(grep -c "on cuda mean" "$O/ep_equal_cuda.log") layouts compared"
    L=$(left)
    echo "crash scripts with $L s left"
    if [[ $L -gt 60 ]]; then
      DZ_GPU_CRASH_ONLY=1 timeout "$L" bash scripts/gpu-tests.sh "$PREFIX" build-gpu /tmp/crashlogs >/tmp/crash.out 2>&1
      echo "crash scripts rc $? at $(($(date +%s) - T0)) s"
      reap
      cp /tmp/crashlogs/crash.log "$O/crash.log" 2>/dev/null
      grep -E "PASS|FAIL" /tmp/crashlogs/crash.log
    fi
    ;;
  tests)
    export DZ_COMMIT=${DZ_COMMIT:?}
    gpu_tests "$O/logs" "${DZ_SPEC:-}" "${DZ_FAMILIES:-}"
    ;;
  cli)
    export DZ_COMMIT=${DZ_COMMIT:?}
    build_project /tmp/build.log
    tail -1 /tmp/build.log
    mkdir -p "$O/logs"
    if [[ -n ${DZ_FAMILIES:-} ]]; then  # those families, then (unless DZ_CLI=families) the runs after them
      cli_part "$O/logs" "$DZ_FAMILIES"
      [[ ${DZ_CLI:-all} == families ]] || DZ_GPU_CLI=extras cli_part "$O/logs" ""
    else
      DZ_GPU_CLI=${DZ_CLI:-all} cli_part "$O/logs" ""
    fi
    ;;
  patch)
    export DZ_COMMIT=${DZ_COMMIT:?}
    queued_ab "${DZ_PATCH:?}" "${DZ_HARNESS:?}" "${DZ_SPEC:-}" "${DZ_FAMILIES:-}"
    ;;
  final)
    export DZ_COMMIT=${DZ_COMMIT:?}
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
    keep=40  # for the e2e runs after the Catch binary
    if [[ -n ${DZ_PATCH:-} ]]; then
      if [[ ${DZ_BENCH_LA:-0} == 1 || ${DZ_BENCH_SPARSE:-0} == 1 ]]; then
        build_project /tmp/build_before.log
        tail -1 /tmp/build_before.log
        mkdir -p "$O/logs"
        [[ ${DZ_BENCH_LA:-0} == 1 ]] && { bench_la 90 "$O/linear_attn_before.json"; keep=$((keep + 40)); }
        [[ ${DZ_BENCH_SPARSE:-0} == 1 ]] &&
          { bench_sparse 60 "$O/sparse_attn_before.json" "$O/logs/sparse_attn_before.log"; keep=$((keep + 20)); }
      fi
      n=0
      for pf in $DZ_PATCH; do
        apply_patches "$pf" || exit 1
        n=$((n + 1))
        [[ ${DZ_LADDER:-0} == 1 && ${DZ_BENCH_LA:-0} == 1 ]] || continue  # each patch's own step
        DZ_TARGETS=dayzero bash scripts/offline-prefix.sh build "$PREFIX" build-gpu >/tmp/build_step.log 2>&1 ||
          { tail -5 /tmp/build_step.log; exit 1; }
        bench_la 60 "$O/linear_attn_step$n.json"
      done
    fi
    build_project /tmp/build.log
    tail -1 /tmp/build.log
    catch_part "$O/logs" "" "$keep"  # first: what a session must not end without
    eval "$(bash scripts/offline-prefix.sh env "$PREFIX")"
    for m in glm5_3_flash_4l:glm qwen3_5_35b_a3b_8l:qwen; do
      [[ $(left) -gt 15 ]] || break
      timeout "$(left)" build-gpu/dayzero bench e2e --model "configs/bench/${m%%:*}" --tokens 8192 --modes last-logits \
        --repeats 7 --json "$O/e2e_dayzero_2026_${m#*:}_${DZ_COMMIT}.json" 2>&1 |
        grep -o '"model":"[^"]*"\|"ms":[0-9.]*' | paste -sd ' '  # in the output too, should a file not come back
    done
    reap
    [[ -n ${DZ_PATCH:-} && ${DZ_BENCH_LA:-0} == 1 && $(left) -gt 30 ]] && bench_la 60 "$O/linear_attn_dayzero.json"
    [[ -n ${DZ_PATCH:-} && ${DZ_BENCH_SPARSE:-0} == 1 && $(left) -gt 20 ]] &&
      bench_sparse 30 "$O/sparse_attn_dayzero.json" "$O/logs/sparse_attn.log"
    cli_part "$O/logs"
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
  ncu)
    export DZ_COMMIT=${DZ_COMMIT:?}
    build_project /tmp/build.log
    tail -1 /tmp/build.log
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
    (eval "$(bash scripts/offline-prefix.sh env "$PREFIX")"
     NCU_SOURCE=${NCU_SOURCE-"mla_decode_fp8 mla_prefill"} NCU_BUDGET=$(($(left) - 10)) OUT=/tmp/ncu \
       bash scripts/ncu-targets.sh)
    # the device tool returns at most 8 files: the summary, and the raw CSVs in one archive
    cp /tmp/ncu/ncu_targets.json "$O/ncu_targets_${DZ_COMMIT}.json" 2>/dev/null
    cp /tmp/ncu/ncu_targets.txt /tmp/ncu/ncu_source.txt "$O/" 2>/dev/null
    tar cJf "$O/ncu_targets_raw.tar.xz" -C /tmp/ncu --exclude='*.ncu-rep' . 2>/dev/null
    ;;
  *) echo "unknown stage $1"; exit 2 ;;
esac
# The device tool returns at most 8 files (2026-12-07: the ladder's JSONs took all 8 and the CLI log
# did not come back): the logs, and the ladder's steps, as one archive.
if [[ -d $O/logs ]] || compgen -G "$O/linear_attn_step*.json" >/dev/null; then
  (cd "$O" && tar cJf logs.tar.xz $(ls -d logs linear_attn_step*.json 2>/dev/null) &&
     rm -rf logs linear_attn_step*.json)
  echo "logs in logs.tar.xz"
fi
