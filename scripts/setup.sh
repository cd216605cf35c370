#!/usr/bin/env bash
# Installs the Debian packages dayzero needs (when missing) and builds it into build/.
# Usage: scripts/setup.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config openmpi-bin libopenmpi-dev libhdf5-dev hdf5-tools
      libcli11-dev catch2 nlohmann-json3-dev
      clang libclang-rt-dev)  # clang + its libFuzzer/sanitizer runtimes: scripts/fuzz.sh (build-fuzz/)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The test scripts' Python helpers (scripts/fp8_checkpoint.py: numpy; tests/golden/numpy_ref.py, the
# fp64 forward every golden is checked against: numpy, h5py, safetensors) need these in the python3
# on PATH, which may not be Debian's (a pyenv one on the CI image): install them from PyPI when missing.
# tokenizers: make-input --text (scripts/dz_tokenize.py, the checkpoint's own tokenizer.json).
for mod in numpy h5py safetensors tokenizers; do
  if ! python3 -c "import $mod" 2>/dev/null; then
    echo "[setup] installing $mod for python3 ($(command -v python3))"
    python3 -m pip install -q "$mod" 2>/dev/null || python3 -m pip install -q --break-system-packages "$mod"
  fi
done

BUILD=${DZ_BUILD_DIR:-build}
GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$BUILD" -j "$(nproc)"
echo "[setup] built $BUILD/dayzero"
