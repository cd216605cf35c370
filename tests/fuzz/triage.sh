#!/usr/bin/env bash
# Replays fuzzer artifacts (crash-*, timeout-*, oom-*, leak-*) with a harness and sorts them:
#   libhdf5  the report's stack starts inside libhdf5 (only libc / sanitizer-runtime frames above
#            the first libhdf5 frame, and no dayzero or harness frame before it), and the memory
#            involved was not allocated or freed by dayzero: libhdf5's own bug, reported in
#            docs/fuzzing.md, not ours to patch;
#   dayzero  anything else that reproduces (our code, or a report with no libhdf5 frame): fails;
#   no-repro the replay runs clean (state-dependent; listed, not failed).
# Usage: tests/fuzz/triage.sh HARNESS ARTIFACT...   (environment: the fuzz tests' ASAN_OPTIONS etc.)
# Exit status 1 when any artifact is "dayzero". A summary line per artifact goes to stdout; the
# first report of each dayzero artifact to stderr.
set -uo pipefail
bin=$1
shift
bad=0
for a in "$@"; do
  [ -f "$a" ] || continue
  out=$("$bin" -timeout=25 -rss_limit_mb=2560 "$a" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "no-repro  $a"
    continue
  fi
  # frames of the first stack in the report
  frames=$(printf '%s\n' "$out" | awk '/^ *#[0-9]+ /{print; seen=1; next} seen{exit}')
  kind=$(printf '%s\n' "$frames" | awk '
    /libhdf5/ { print "libhdf5"; found=1; exit }
    /dz::|\/tests\/fuzz\/|LLVMFuzzerTestOneInput|\/lib\/(io|config|core)\// { print "dayzero"; found=1; exit }
    END { if (!found) print "dayzero" }')
  # libhdf5 writing past (or after freeing) memory dayzero allocated is ours until shown otherwise
  # (a wrong size passed to H5Dread looks exactly like that)
  if [ "$kind" = libhdf5 ] && printf '%s\n' "$out" |
    awk '/(allocated|freed) by thread/{s=1; next} s && /^ *#[0-9]+ /{print; next} s{s=0}' |
    grep -qE 'dz::|/tests/fuzz/|/lib/(io|config|core)/'; then
    kind=dayzero
  fi
  top=$(printf '%s\n' "$out" | grep -m1 -E 'ERROR: |runtime error|deadly signal|ALARM|dz fuzz' | sed 's/^==[0-9]*==//')
  printf '%-8s  %s  %s\n' "$kind" "$a" "$top"
  if [ "$kind" = dayzero ]; then
    bad=1
    printf '%s\n' "$out" | grep -E -A40 -m1 'ERROR: |runtime error|deadly signal|ALARM|dz fuzz' >&2
  fi
done
exit $bad
