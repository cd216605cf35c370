# Shared by the slurm test scripts: $1 = dayzero binary, $2 = source dir.
# Starts a private one-node Slurm (scripts/slurm-local.sh) in a scratch folder and stops every
# daemon it started on exit, whatever happens. Set DZ_KEEP=1 to keep the scratch folder.
set -euo pipefail
DZ=$(readlink -f "$1")
SRC=$(readlink -f "$2")
source "$SRC/scripts/env.sh"
source "$SRC/tests/h5_checks.sh"  # same, ndone, supports_stop
W=$(mktemp -d /tmp/dz_slurm_XXXXXX)
CL=$W/cluster
T0=$(date +%s)
say() { echo "[$(basename "$0" .sh) +$(($(date +%s) - T0))s] $*"; }
fail() {
  echo "FAIL: $*"
  exit 1
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ $rc -ne 0 ]; then
    echo "---- job logs and daemon log tails ($W) ----"
    for f in "$W"/*.out; do [ -e "$f" ] && { echo "== $f"; tail -30 "$f"; }; done
    tail -15 "$CL/log/slurmctld.log" "$CL/log/slurmd.log" 2>/dev/null || true
  fi
  bash "$SRC/scripts/slurm-local.sh" stop "$CL" || true
  [ "${DZ_KEEP:-0}" = 1 ] && echo "kept $W" || rm -rf "$W"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bash "$SRC/scripts/slurm-local.sh" start "$CL"
export SLURM_CONF=$CL/slurm.conf
# what every job gets (sbatch exports the environment): the binary, no env file, a short stop path
export DZ_BIN=$DZ DZ_ENV="" DZ_PROGRESS=1 DZ_STOP_GRACE=10 OMPI_MCA_odls_base_sigkill_timeout=2
cd "$W"

# submit TEMPLATE [sbatch options...]: prints the job id (logs go to $W/%x-%j.out)
submit() {
  local t=$1; shift
  sbatch --parsable --time=10 --output="$W/%x-%j.out" "$@" "$SRC/slurm/$t" | cut -d';' -f1
}
job_state() { scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
job_field() { scontrol show job "$1" 2>/dev/null | tr ' ' '\n' | grep "^$2=" | cut -d= -f2-; }
log_of() { ls "$W"/*-"$1".out 2>/dev/null | head -1; }
# wait_gone JOB SECONDS: until the job left the queue (finished, failed or cancelled)
wait_gone() {
  local j=$1 limit=$2 s=$SECONDS
  while [ -n "$(squeue -h -j "$j" -o %i 2>/dev/null)" ]; do
    [ $((SECONDS - s)) -lt "$limit" ] || fail "job $j still in the queue after ${limit}s ($(job_state "$j"))"
    sleep 0.5
  done
}
# wait_done FILE N SECONDS: until FILE has >= N durable documents
wait_done() {
  local f=$1 n=$2 limit=$3 s=$SECONDS
  while [ "$(ndone "$f")" -lt "$n" ]; do
    [ $((SECONDS - s)) -lt "$limit" ] || fail "$f has fewer than $n done documents after ${limit}s"
    sleep 0.3
  done
}
