#!/usr/bin/env bash
# SIGKILL of one rank mid-run makes the whole job exit non-zero promptly (< 30 s, no hang), leaves
# no OUT.h5, and a .part that --resume completes equal to an uninterrupted run. Victims: a
# non-writer rank (rank 1 of 3), then the writer (rank 0), killed while documents are being written.
source "$(dirname "$0")/lib.sh"
setup_common
LIMIT=30
for victim in 1 0; do
  out=$W/k$victim.h5
  start_job 3 run "${ARGS[@]}" --output "$out"
  wait_done "$out.part" 3 120
  pid=$(rank_pid $victim "$out")
  [ -n "$pid" ] || fail "rank $victim not found by its command line"
  kill -KILL "$pid"
  wait_job $LIMIT
  say "SIGKILL of rank $victim (pid $pid): job exit $RC after ${ELAPSED}s"
  [ "$RC" -ne 0 ] || fail "the job exited 0 after a rank was killed"
  left=$(procs "--output $out( |$)")
  [ -z "$left" ] || fail "processes left behind: $left"
  check_resume "$out"
  say "  $DONE_AT_STOP documents were durable; --resume equals the uninterrupted run"
done
say "PASS"
