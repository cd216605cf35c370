#!/usr/bin/env bash
# SIGTERM mid-run (Slurm's preemption and time-limit signal) stops the job within a bounded time:
# non-zero exit (143 when every rank gets the signal, as Slurm does), no OUT.h5, OUT.h5.part keeps
# every finished document, and --resume completes it equal to an uninterrupted run. Two deliveries:
# (1) to every rank process (what scancel / preemption / time limit do), (2) to mpirun only.
source "$(dirname "$0")/lib.sh"
setup_common
LIMIT=30  # seconds from the signal to the job's exit (mpirun's own kill path takes ~2 s)

# (1) every rank gets SIGTERM
start_job 2 run "${ARGS[@]}" --output "$W/a.h5"
wait_done "$W/a.h5.part" 3 120
ranks=$(children "$JOB")
[ -n "$ranks" ] || fail "mpirun (pid $JOB) has no child processes to signal"
kill -TERM $ranks
wait_job $LIMIT
say "SIGTERM to every rank: exit $RC after ${ELAPSED}s"
[ "$RC" -ne 0 ] || fail "the job exited 0 after SIGTERM"
if supports_stop; then
  [ "$RC" -eq 143 ] || { cat "$W/job.out"; fail "expected exit code 143 after SIGTERM, got $RC"; }
  msg=$(grep "^dayzero: stopped by signal 15: [0-9]* documents [a-z ]*, [0-9]* remaining; rerun with --resume" "$W/job.out" || true)
  [ -n "$msg" ] || { cat "$W/job.out"; fail "no 'dayzero: stopped by signal 15: ...' line"; }
  say "  $msg"
fi
check_resume "$W/a.h5"
say "  $DONE_AT_STOP documents were durable; --resume equals the uninterrupted run"

# (2) only mpirun gets SIGTERM (someone kills the launcher): Open MPI terminates the ranks
start_job 2 run "${ARGS[@]}" --output "$W/b.h5"
wait_done "$W/b.h5.part" 3 120
kill -TERM "$JOB"
wait_job $LIMIT
say "SIGTERM to mpirun: exit $RC after ${ELAPSED}s"
[ "$RC" -ne 0 ] || fail "the job exited 0 after SIGTERM"
check_resume "$W/b.h5"
say "  $DONE_AT_STOP documents were durable; --resume equals the uninterrupted run"
left=$(procs "--output $W/")
[ -z "$left" ] || fail "processes left behind: $left"
say "PASS"
