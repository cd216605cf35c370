# Shared by the crash test scripts: $1 = dayzero binary, $2 = source dir.
# Environment: DZ_TEST_BACKEND=cpu|cuda (default cpu) is passed as --backend to every `dayzero run`
# of the tests, the uninterrupted reference included, so the bitwise checks compare a backend with
# itself; DZ_TEST_DOCS (default 200) sizes the workload of setup_common; DZ_TEST_MIN_SECONDS (default
# 0: off) makes setup_common grow the workload until the reference run lasts at least that long
# (a fast GPU must not finish before the test's signal arrives); DZ_KEEP=1 keeps the work dir.
set -euo pipefail
DZ=$(readlink -f "$1")
SRC=$(readlink -f "$2")
source "$SRC/scripts/env.sh"
source "$SRC/tests/h5_checks.sh"  # same, ndone, supports_stop
BACKEND=${DZ_TEST_BACKEND:-cpu}
[[ $BACKEND == cpu || $BACKEND == cuda ]] || { echo "FAIL: DZ_TEST_BACKEND must be cpu or cuda (got '$BACKEND')"; exit 1; }
for t in mpirun setsid python3; do
  command -v "$t" >/dev/null || { echo "FAIL: $t is needed by the crash tests and not found"; exit 1; }
done
W=$(mktemp -d /tmp/dz_crash_XXXXXX)
JOB=""  # pid of a background mpirun (its own process group), killed on exit if still there
cleanup() {
  local rc=$?
  [ -n "$JOB" ] && kill -KILL -- "-$JOB" 2>/dev/null
  [ "${DZ_KEEP:-0}" = 1 ] && echo "kept $W" || rm -rf "$W"
  exit $rc
}
trap cleanup EXIT
T0=$(date +%s)
say() { echo "[$(basename "$0" .sh) +$(($(date +%s) - T0))s] $*"; }
fail() { echo "FAIL: $*"; exit 1; }
wait_done() {  # wait_done FILE N SECONDS
  local f=$1 n=$2 limit=$3 s=$SECONDS
  while [ "$(ndone "$f")" -lt "$n" ]; do
    [ $((SECONDS - s)) -lt "$limit" ] || fail "$f has fewer than $n done documents after ${limit}s"
    kill -0 "$JOB" 2>/dev/null || fail "the job ended before $n documents were done"
    sleep 0.2
  done
}
# start_job NP ARGS...: mpirun in the background, in its own process group; sets JOB
start_job() {
  local np=$1; shift
  setsid mpirun -np "$np" --oversubscribe "$DZ" "$@" >"$W/job.out" 2>&1 &
  JOB=$!
}
ms_now() { echo $(($(date +%s%N) / 1000000)); }  # milliseconds (bash arithmetic: no bc needed)
# wait_job SECONDS: waits for the background mpirun; sets RC and ELAPSED; fails (and kills the
# whole process group) if it has not exited within SECONDS
wait_job() {
  local limit=$1 s ms
  s=$(ms_now)
  while kill -0 "$JOB" 2>/dev/null; do
    if [ $(($(ms_now) - s)) -gt $((limit * 1000)) ]; then
      kill -KILL -- "-$JOB" 2>/dev/null
      cat "$W/job.out"
      fail "the job did not exit within ${limit}s (hang)"
    fi
    sleep 0.1
  done
  set +e
  wait "$JOB"
  RC=$?
  set -e
  ms=$(($(ms_now) - s))
  ELAPSED=$((ms / 1000)).$((ms % 1000 / 100))
  JOB=""
}
# procs REGEX: "pid command line" of every process whose command line (arguments joined by spaces)
# matches the extended regex, as `pgrep -af` prints them; read from /proc in bash (procps need not
# be installed; the scan runs no process of its own that could match)
procs() {
  local d a IFS=' '
  for d in /proc/[0-9]*; do
    { mapfile -d '' -t a <"$d/cmdline"; } 2>/dev/null || continue
    ((${#a[@]})) && [[ "${a[*]}" =~ $1 ]] && echo "${d#/proc/} ${a[*]}"
  done
  return 0
}
# children PID: the pids of PID's child processes (what `pkill -P PID` signals)
children() {
  local d st f
  for d in /proc/[0-9]*; do
    { read -r st <"$d/stat"; } 2>/dev/null || continue
    read -r -a f <<<"${st##*) }"  # after "pid (comm) ": state ppid ...
    [ "${f[1]}" = "$1" ] && echo "${d#/proc/}"
  done
  return 0
}
# rank_pid R OUTPUT: pid of MPI rank R of the dayzero run writing OUTPUT (found by command line)
rank_pid() {
  local p
  for p in $(procs "$DZ run .*--output $2( |$)" | cut -d' ' -f1); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dayzero ] || continue
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then echo "$p"; return; fi
  done
}
# the demo model, DZ_TEST_DOCS documents of 40..200 tokens (200: ~25k tokens, several seconds on 2
# cores) and an uninterrupted reference on the test backend; with DZ_TEST_MIN_SECONDS the input
# grows (up to three times) until the reference lasts that long
setup_common() {
  N=${DZ_TEST_DOCS:-200}
  local min=${DZ_TEST_MIN_SECONDS:-0} t ms tries=0
  [[ $N =~ ^[0-9]+$ ]] && [ "$N" -ge 10 ] || fail "DZ_TEST_DOCS must be an integer >= 10 (got '$N')"
  [[ $min =~ ^[0-9]+$ ]] || fail "DZ_TEST_MIN_SECONDS must be a whole number of seconds (got '$min')"
  "$DZ" make-model --preset demo --out "$W/m" 2>/dev/null
  ARGS=(--model "$W/m" --input "$W/in.h5" --backend "$BACKEND")
  while :; do
    rm -f "$W/in.h5" "$W/ref.h5"
    "$DZ" make-input --model "$W/m" --docs "$N" --min-len 40 --max-len 200 --seed 7 --out "$W/in.h5" 2>/dev/null
    t=$(ms_now)
    mpirun -np 2 --oversubscribe "$DZ" run "${ARGS[@]}" --output "$W/ref.h5" 2>/dev/null
    ms=$(($(ms_now) - t))
    say "reference: $N documents on $BACKEND in $((ms / 1000)).$((ms % 1000 / 100))s"
    if [ "$ms" -ge $((min * 1000)) ] || [ "$tries" -ge 3 ]; then break; fi
    tries=$((tries + 1))
    N=$(((N * min * 1000 * 5 / 4 + ms - 1) / ms))  # the time scaled to 1.25 x the minimum
  done
}
# check_part OUT: no OUT, a .part with >= 1 and < N done documents; --resume completes it equal to ref
check_resume() {
  local out=$1 n
  [ ! -e "$out" ] || fail "an interrupted run left a final $out"
  [ -e "$out.part" ] || fail "no $out.part after the interruption"
  n=$(ndone "$out.part")
  [ "$n" -ge 1 ] && [ "$n" -lt $N ] || fail "expected 1 <= done < $N in $out.part, got $n"
  mpirun -np 2 --oversubscribe "$DZ" run "${ARGS[@]}" --output "$out" --resume --report "$W/rep.json" 2>"$W/resume.err" ||
    { cat "$W/resume.err"; fail "--resume failed"; }
  same "$W/ref.h5" "$out" /logprobs /offsets /done
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['documents_skipped_done'] == $n, r['documents_skipped_done']" \
    "$W/rep.json" || fail "--resume did not skip exactly the $n done documents"
  DONE_AT_STOP=$n
}
