# Shared by the crash test scripts: $1 = dayzero binary, $2 = source dir.
set -euo pipefail
DZ=$(readlink -f "$1")
SRC=$(readlink -f "$2")
source "$SRC/scripts/env.sh"
source "$SRC/tests/h5_checks.sh"  # same, ndone, supports_stop
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
# wait_job SECONDS: waits for the background mpirun; sets RC and ELAPSED; fails (and kills the
# whole process group) if it has not exited within SECONDS
wait_job() {
  local limit=$1 s
  s=$(date +%s.%N)
  while kill -0 "$JOB" 2>/dev/null; do
    if [ "$(echo "$(date +%s.%N) - $s > $limit" | bc)" = 1 ]; then
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
  ELAPSED=$(echo "$(date +%s.%N) - $s" | bc | xargs printf '%.1f')
  JOB=""
}
# rank_pid R OUTPUT: pid of MPI rank R of the dayzero run writing OUTPUT (found with pgrep -f)
rank_pid() {
  local p
  for p in $(pgrep -f -- "$DZ run .*--output $2( |$)"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dayzero ] || continue
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then echo "$p"; return; fi
  done
}
# the demo model, ~25k tokens (several seconds on 2 cores) and an uninterrupted reference
setup_common() {
  "$DZ" make-model --preset demo --out "$W/m" 2>/dev/null
  "$DZ" make-input --model "$W/m" --docs 200 --min-len 40 --max-len 200 --seed 7 --out "$W/in.h5" 2>/dev/null
  mpirun -np 2 --oversubscribe "$DZ" run --model "$W/m" --input "$W/in.h5" --output "$W/ref.h5" 2>/dev/null
  ARGS=(--model "$W/m" --input "$W/in.h5")
  N=200
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
