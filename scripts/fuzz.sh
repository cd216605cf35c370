#!/usr/bin/env bash
# libFuzzer harnesses of the parsers a user's file reaches (tests/fuzz/, docs/fuzzing.md), built
# with clang (-fsanitize=fuzzer,address,undefined) in their own build directory, never build/.
#
#   scripts/fuzz.sh build                 configure + build build-fuzz/ (DZ_FUZZ_BUILD_DIR)
#   scripts/fuzz.sh smoke                 build, then ctest -L fuzz: each harness once over its
#                                         committed seeds, and 60 s of fuzzing each (CI)
#   scripts/fuzz.sh run NAME [ARGS...]    build, then fuzz NAME (safetensors | config | input) on
#                                         build-fuzz/fuzz/corpus/NAME + its seeds with the same
#                                         options as the smoke test; ARGS go to libFuzzer, e.g.
#                                         -runs=10000000, -max_total_time=1800, -jobs=2 -workers=2
#   scripts/fuzz.sh repro NAME FILE...    run NAME's harness on FILEs (a crash-* artifact)
#   scripts/fuzz.sh triage NAME [FILE...] sort artifacts (default: build-fuzz/fuzz/artifacts/NAME-*
#                                         and NAME-smoke-*/*) into libhdf5 / dayzero / no-repro
#
# Long runs of the input harness: libhdf5 itself crashes on some corrupt files, so use fork mode,
# which keeps going, and triage afterwards:  scripts/fuzz.sh run input -fork=2 -ignore_crashes=1
# -runs=10000000; scripts/fuzz.sh triage input.
#
# Needs clang++ and the libFuzzer runtime (Debian: clang libclang-rt-dev; installed when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD=${DZ_FUZZ_BUILD_DIR:-build-fuzz}
CXX_FUZZ=${DZ_FUZZ_CXX:-clang++}
CC_FUZZ=${DZ_FUZZ_CC:-clang}

need_clang() {
  local ok=1
  command -v "$CXX_FUZZ" >/dev/null || ok=0
  if ((ok)); then
    # the fuzzer runtime is a separate package on Debian (libclang-rt-NN-dev)
    echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
      "$CXX_FUZZ" -x c++ -fsanitize=fuzzer,address,undefined -o /dev/null - 2>/dev/null || ok=0
  fi
  if ((!ok)); then
    echo "[fuzz] installing clang libclang-rt-dev"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-dev >/dev/null
  fi
}

build() {
  need_clang
  local gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$CXX_FUZZ" \
      -DCMAKE_C_COMPILER="$CC_FUZZ" -DDAYZERO_CUDA=OFF -DDZ_FUZZ=ON >/dev/null
  else
    cmake "$BUILD" >/dev/null
  fi
  cmake --build "$BUILD" -j "$(nproc)" --target dz_fuzz_safetensors dz_fuzz_config dz_fuzz_input
  echo "[fuzz] built $BUILD/tests/dz_fuzz_{safetensors,config,input}"
}

# The smoke tests' settings (tests/CMakeLists.txt), for run / repro.
fuzz_env() {
  export ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:max_allocation_size_mb=256:detect_leaks=1}
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$ROOT/tests/fuzz/lsan.supp:print_suppressions=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  export HDF5_USE_FILE_LOCKING=FALSE
}

max_len() {
  case "$1" in
    config) echo 4096 ;;
    safetensors | input) echo 65536 ;;
    *) echo "[fuzz] unknown harness '$1' (safetensors, config or input)" >&2; exit 2 ;;
  esac
}

seeds() {  # as tests/CMakeLists.txt: committed seeds, past findings, (config) the repo's configs
  local d
  for d in "$ROOT/tests/fuzz/seeds/$1" "$ROOT/tests/fuzz/findings/$1"; do [ -d "$d" ] && echo "$d"; done
  [ "$1" = config ] && echo "$ROOT/$BUILD/fuzz/seeds-config-repo"
  return 0
}

cmd=${1:-smoke}
shift || true
case "$cmd" in
  build) build ;;
  smoke)
    build
    cd "$BUILD"
    # the three 60-s runs side by side (wall time ~1 min on any core count), then the seed replays
    ctest --output-on-failure -L fuzz -j 3 --timeout 900
    ;;
  run)
    name=${1:?usage: scripts/fuzz.sh run NAME [libFuzzer args]}
    shift
    ml=$(max_len "$name")
    build >/dev/null
    fuzz_env
    mkdir -p "$BUILD/fuzz/corpus/$name" "$BUILD/fuzz/artifacts"
    mapfile -t sd < <(seeds "$name")
    # scratch files of the harness (fuzz_common.hpp), on tmpfs when there is one; crashed
    # fork-mode children leave theirs: one directory per harness, emptied at the next run
    if [ -z "${DZ_FUZZ_TMP:-}" ]; then
      tb=/dev/shm; [ -d "$tb" ] && [ -w "$tb" ] || tb=${TMPDIR:-/tmp}
      export DZ_FUZZ_TMP=$tb/dz-fuzz-run-$name
      rm -rf "$DZ_FUZZ_TMP"
    fi
    mkdir -p "$DZ_FUZZ_TMP"
    exec "$BUILD/tests/dz_fuzz_$name" -max_len="$ml" -dict="$BUILD/fuzz/$name.dict" -timeout=20 -rss_limit_mb=2560 \
      -artifact_prefix="$ROOT/$BUILD/fuzz/artifacts/$name-" -print_final_stats=1 "$@" \
      "$BUILD/fuzz/corpus/$name" "${sd[@]}"
    ;;
  repro)
    name=${1:?usage: scripts/fuzz.sh repro NAME FILE...}
    shift
    build >/dev/null
    fuzz_env
    exec "$BUILD/tests/dz_fuzz_$name" "$@"
    ;;
  triage)
    name=${1:?usage: scripts/fuzz.sh triage NAME [FILE...]}
    shift
    build >/dev/null
    fuzz_env
    if (($# == 0)); then
      shopt -s nullglob
      set -- "$BUILD"/fuzz/artifacts/"$name"-* "$BUILD"/fuzz/artifacts/"$name"-smoke-*/*
    fi
    exec tests/fuzz/triage.sh "$BUILD/tests/dz_fuzz_$name" "$@"
    ;;
  *) sed -n '2,21p' "$0"; exit 2 ;;
esac
