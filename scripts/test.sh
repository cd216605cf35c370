#!/usr/bin/env bash
# Builds dayzero and runs every test CI runs (labels unit, mpi, golden, slurm; not gpu), then the
# fuzz smoke tests (label fuzz) in build-fuzz/ (scripts/fuzz.sh smoke).
set -euo pipefail
cd "$(dirname "$0")/.."
DZ_BUILD_DIR=${DZ_BUILD_DIR:-build} bash scripts/setup.sh
# the lm-evaluation-harness adapter (python/, with lm_eval from PyPI: no torch): tests/mpi/lm_eval.sh
if ! python3 -c "import dayzero_lm_eval" 2>/dev/null; then
  echo "[test] installing the lm-eval adapter (python/) for python3 ($(command -v python3))"
  python3 -m pip install -q -e python/ 2>/dev/null || python3 -m pip install -q --break-system-packages -e python/
fi
source scripts/env.sh
cd "${DZ_BUILD_DIR:-build}"
ctest --output-on-failure -L 'unit|mpi|golden|slurm' -LE gpu -j 2 --timeout 900
cd - >/dev/null
# libFuzzer harnesses of the parsers a user's file reaches, in their own clang build (build-fuzz/):
# the seed replays and 60 s of fuzzing each, ~2.5 min (docs/fuzzing.md). DZ_FUZZ_SMOKE=0 skips.
if [ "${DZ_FUZZ_SMOKE:-1}" != 0 ]; then
  bash scripts/fuzz.sh smoke
fi
