#!/usr/bin/env bash
# Builds dayzero and runs every test CI runs (labels unit, mpi, golden, slurm; not gpu).
set -euo pipefail
cd "$(dirname "$0")/.."
DZ_BUILD_DIR=${DZ_BUILD_DIR:-build} bash scripts/setup.sh
source scripts/env.sh
cd "${DZ_BUILD_DIR:-build}"
ctest --output-on-failure -L 'unit|mpi|golden|slurm' -LE gpu -j 2 --timeout 900
