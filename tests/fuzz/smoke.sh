#!/usr/bin/env bash
# A fuzz smoke test (ctest fuzz_NAME, label fuzz): run HARNESS for SECONDS in libFuzzer's fork
# mode, so a crash does not end the run, then replay every artifact with triage.sh. Fails when
# the fuzzer cannot run or an artifact is dayzero's (a crash, sanitizer report, timeout or OOM
# in our code); crashes inside libhdf5 itself are listed and do not fail (docs/fuzzing.md).
# Usage: tests/fuzz/smoke.sh HARNESS ARTIFACT_DIR SECONDS [libFuzzer options] CORPUS_DIR SEED_DIR...
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1 art=$2 secs=$3
shift 3
name=$(basename "$bin")
name=${name#dz_fuzz_}
run=$art/$name-smoke-$(date +%Y%m%d-%H%M%S)-$$
mkdir -p "$run"
log=$run.log
# the harnesses' scratch files (fuzz_common.hpp): a child that crashes leaves its own behind
tmpbase=/dev/shm
[ -d "$tmpbase" ] && [ -w "$tmpbase" ] || tmpbase=${TMPDIR:-/tmp}
DZ_FUZZ_TMP=$(mktemp -d "$tmpbase/dz-fuzz-smoke.XXXXXX")
export DZ_FUZZ_TMP
trap 'rm -rf "$DZ_FUZZ_TMP"' EXIT
"$bin" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 -max_total_time="$secs" \
  -artifact_prefix="$run/" "$@" > "$log" 2>&1
rc=$?
grep -vE '^(INFO: (Running with|Seed:|Loaded|-fork=1: fuzzing)|MERGE-)' "$log"
# In fork mode libFuzzer exits with the status of the last job it reaped, so an ignored crash
# near the end makes it non-zero; what counts is that the fork loop ran to its end ("exiting"),
# and then what triage says of the artifacts.
if ! grep -q '^INFO: exiting: ' "$log"; then
  echo "[fuzz smoke] $(basename "$bin") did not run to the end (exit status $rc)"
  exit 1
fi
rm -f "$log"
shopt -s nullglob
arts=("$run"/*)
if ((${#arts[@]} == 0)); then
  echo "[fuzz smoke] $(basename "$bin"): ${secs} s, no crash, no sanitizer report"
  rmdir "$run"
  exit 0
fi
echo "[fuzz smoke] $(basename "$bin"): ${#arts[@]} artifact(s) in $run:"
"$here/triage.sh" "$bin" "${arts[@]}"
