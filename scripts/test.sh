#!/usr/bin/env bash
# Builds dayzero and runs every test CI runs (labels unit, mpi, golden, slurm; not gpu), then the
# fuzz smoke tests (label fuzz) in build-fuzz/ (scripts/fuzz.sh smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
DZ_BUILD_DIR=${DZ_BUILD_DIR:-build} bash scripts/setup.sh
source scripts/env.sh
cd "${DZ_BUILD_DIR:-build}"
ctest --output-on-failure -L 'unit|mpi|golden|slurm' -LE gpu -j 2 --timeout 900
cd - >/dev/null
# libFuzzer harnesses of the parsers a user's file reaches, in their own clang build (build-fuzz/):
# the seed replays and 60 s of fuzzing each, ~2.5 min (docs/fuzzing.md). DZ_FUZZ_SMOKE=0 skips.
if [ "${DZ_FUZZ_SMOKE:-1}" != 0 ]; then
  bash scripts/fuzz.sh smoke
fi
