#!/usr/bin/env bash
# Build and run dayzero on an air-gapped node (DESIGN.md §8) from a prefix of Debian packages.
#
#   scripts/offline-prefix.sh download DIR   # on a connected Debian/Ubuntu machine (same arch):
#                                            # apt-get download + dpkg -x of OpenMPI, HDF5, CLI11,
#                                            # Catch2 v2, nlohmann-json and their library deps
#   scripts/offline-prefix.sh env DIR        # prints the exports; use: eval "$(... env DIR)"
#   scripts/offline-prefix.sh build DIR [BUILD_DIR] [cmake args...]
#                                            # on the node: configure + build against DIR
#
# The node needs only a compiler, cmake and (for the CUDA build) nvcc; copy DIR there with the
# tree. Packages a base image already has (Priority required/important, the C/C++ runtime) are
# not fetched; documentation, man pages, static archives and Fortran bindings are dropped to keep
# the prefix small (about 30 MB).
set -euo pipefail

# What dayzero needs: MPI (headers, wrappers, mpirun), serial HDF5 (headers + runtime), CLI11,
# Catch2 v2, nlohmann-json.
TOP=(openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libhdf5-dev libhdf5-103-1 libhdf5-hl-100
     hdf5-helpers libcli11-dev catch2 nlohmann-json3-dev
     # in apt's closure on Debian, but missing from the H200 image (libhdf5 -> libcurl -> libidn2):
     # seen there as "libunistring.so.2: cannot open shared object file" for the dayzero binary
     libunistring2)
# In every base image (or the compiler's own runtime): never fetched.
BASE_RE='^(libc6|libc6-dev|libgcc-s1|libstdc\+\+6|gcc-[0-9]+-base|zlib1g|libzstd1|liblzma5|libbz2-1\.0|libselinux1|libpcre2-8-0|libcrypt1|libtinfo6|libudev1|libsystemd0|libcap2|libgcrypt20|libgpg-error0|liblz4-1|libdb5\.3|libaudit1|libaudit-common|libcap-ng0|libacl1|libattr1|debconf|dpkg|perl-base|libsemanage.*|libsepol.*)$'
# Not needed to build or run dayzero (Fortran, compilers, docs, JS for HTML docs, ssh).
SKIP_RE='(^libhwloc-plugins$|^libxnvctrl|^libx11|^libxcb|^libxau|^libxdmcp|^libxext|^libicu|^libxml2|gfortran|flang|fortran|^gcc|^g\+\+|^cpp|^binutils|^libjs-|^openssh|^ssh|-doc$|^perl|^python|^libperl|^libhdf5-(cpp|hl-cpp)|^libcoarrays|^libgcc-[0-9]+-dev|^libstdc\+\+-[0-9]+-dev|^linux-libc-dev|^libibverbs-dev|^ibverbs-providers$|-dev-bin$)'

die() { echo "offline-prefix: $*" >&2; exit 1; }

cmd_download() {
  local D=$1
  command -v apt-get >/dev/null || die "apt-get not found (run 'download' on a connected Debian/Ubuntu machine)"
  mkdir -p "$D/debs"
  D=$(cd "$D" && pwd)
  # Breadth-first over Depends/Pre-Depends (first alternative of each group), descending only
  # through packages we keep, so the dependencies of skipped packages (compilers, -dev of
  # dependencies) never enter.
  # Every base image with apt has apt's own dependency closure (libc, gnutls, ...): not fetched.
  local base
  base=" $(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
            --no-enhances apt | grep -E '^[a-z0-9]' | sort -u | tr '\n' ' ') "
  local pkgs=() queue=("${TOP[@]}") seen=" "
  while ((${#queue[@]})); do
    local p=${queue[0]}
    queue=("${queue[@]:1}")
    [[ $seen == *" $p "* ]] && continue
    seen+="$p "
    local top=0
    for t in "${TOP[@]}"; do [[ $p == "$t" ]] && top=1; done
    if ((!top)); then
      [[ $p =~ $BASE_RE || $p =~ $SKIP_RE || $base == *" $p "* ]] && continue
      [[ $p == lib* && $p != *-dev ]] || continue  # below the top set: runtime libraries only
      local prio
      prio=$(apt-cache show "$p" 2>/dev/null | awk '/^Priority:/{print $2; exit}')
      [[ $prio == required || $prio == important ]] && continue
    fi
    pkgs+=("$p")
    # "|Depends: a" then "Depends: b" is the group a|b: take a. Virtual names (<x>) are skipped.
    local deps
    deps=$(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
             --no-enhances "$p" | awk '
      /^ *\|?(Pre)?Depends:/ { name=$2; alt=($1 ~ /^\|/);
        if (!ingroup && name !~ /^</) print name; ingroup=alt }')
    for d in $deps; do queue+=("${d%%:*}"); done
  done
  echo "[offline-prefix] fetching ${#pkgs[@]} packages: ${pkgs[*]}"
  (cd "$D/debs" && apt-get download "${pkgs[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  for f in "$D"/debs/*.deb; do dpkg -x "$f" "$D"; done
  # Trim what no build or run reads.
  rm -rf "$D"/usr/share/{doc,man,info,lintian,locale,bug} "$D"/usr/share/openmpi/amca-param-sets
  find "$D/usr/lib" -name '*.a' -delete
  # Open MPI's internal headers (for building MCA components) and the Java/OpenSHMEM layers.
  rm -rf "$D"/usr/lib/x86_64-linux-gnu/openmpi/include/openmpi "$D"/usr/lib/x86_64-linux-gnu/lib{mpi_java,oshmem}.so*
  mkdir -p "$D"/usr/lib/x86_64-linux-gnu/openmpi/include/openmpi  # the wrapper still names it
  find "$D/usr/lib" \( -name '*fortran*' -o -name '*mpifh*' -o -name '*usempi*' -o -name '*.mod' \) -exec rm -rf {} +
  rm -rf "$D/debs"
  echo "[offline-prefix] $D: $(du -sh "$D" | cut -f1)"
}

cmd_env() {
  local D
  D=$(cd "$1" && pwd)
  local L=$D/usr/lib/x86_64-linux-gnu
  cat <<EOF
export DZ_PREFIX="$D"
export PATH="$D/usr/bin:\$PATH"
export LD_LIBRARY_PATH="$L:$L/openmpi/lib:$L/hdf5/serial\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export LIBRARY_PATH="$L\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
export CPATH="$D/usr/include:$D/usr/include/hdf5/serial:$L/openmpi/include\${CPATH:+:\$CPATH}"
export CMAKE_PREFIX_PATH="$D/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export OPAL_PREFIX="$D/usr"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
export HDF5_USE_FILE_LOCKING=FALSE
export NCCL_NVLS_ENABLE=0
EOF
}

cmd_build() {
  local D
  D=$(cd "$1" && pwd)
  shift
  local B=${1:-build}
  (($#)) && shift
  eval "$(cmd_env "$D")"
  # h5cc hard-codes /usr: make a copy that points into the prefix for CMake's FindHDF5.
  sed -e "s#^prefix=\"/usr\"#prefix=\"$D/usr\"#" "$D/usr/bin/h5cc" >"$D/usr/bin/h5cc.dz"
  chmod +x "$D/usr/bin/h5cc.dz"
  local root
  root=$(cd "$(dirname "$0")/.." && pwd)
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  # Everything from the prefix, named explicitly: an image's own CMAKE_PREFIX_PATH, system HDF5 or
  # MPI must not be picked up instead (seen: an image whose environment broke find_path for Catch2).
  [[ -f $D/usr/include/catch2/catch.hpp ]] || die "$D has no usr/include/catch2/catch.hpp (run 'download' again)"
  local pkg=() f
  f=$(find "$D/usr" -name nlohmann_jsonConfig.cmake | head -1)
  [[ -n $f ]] && pkg+=(-Dnlohmann_json_DIR="$(dirname "$f")")
  f=$(find "$D/usr" -name CLI11Config.cmake | head -1)
  [[ -n $f ]] && pkg+=(-DCLI11_DIR="$(dirname "$f")")
  cmake -S "$root" -B "$B" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$D/usr" -DCATCH2_INCLUDE="$D/usr/include" "${pkg[@]}" \
    -DMPI_CXX_COMPILER="$D/usr/bin/mpicxx.openmpi" -DMPI_C_COMPILER="$D/usr/bin/mpicc.openmpi" \
    -DMPIEXEC_EXECUTABLE="$D/usr/bin/mpirun.openmpi" -DMPI_CXX_SKIP_MPICXX=ON \
    -DHDF5_C_COMPILER_EXECUTABLE="$D/usr/bin/h5cc.dz" -DHDF5_NO_FIND_PACKAGE_CONFIG_FILE=ON \
    -DCMAKE_BUILD_RPATH="$D/usr/lib/x86_64-linux-gnu" "$@"
  local cache=$B/CMakeCache.txt
  echo "[offline-prefix] MPI: $(grep -m1 '^MPI_CXX_COMPILER:' "$cache" | cut -d= -f2) ($("$D/usr/bin/mpirun.openmpi" --version 2>/dev/null | head -1))"
  echo "[offline-prefix] HDF5: $(grep -m1 '^HDF5_hdf5_LIBRARY_RELEASE:' "$cache" | cut -d= -f2)$(grep -m1 'define H5_VERS_INFO' "$D/usr/include/hdf5/serial/H5public.h" | cut -d'"' -f2 | sed 's/^/, /')"
  echo "[offline-prefix] Catch2: $(grep -m1 '^CATCH2_INCLUDE:' "$cache" | cut -d= -f2); CUDA: $(grep -m1 '^DAYZERO_CUDA:' "$cache" | cut -d= -f2)"
  # DZ_TARGETS (space-separated) limits what is built, e.g. "dz_gpu_tests".
  cmake --build "$B" -j "$(nproc)" ${DZ_TARGETS:+--target $DZ_TARGETS}
  echo "[offline-prefix] built $B (source '$0 env $D' before running)"
}

(($# >= 2)) || die "usage: $0 {download|env|build} DIR [BUILD_DIR] [cmake args...]"
case $1 in
  download) cmd_download "$2" ;;
  env) cmd_env "$2" ;;
  build) shift; cmd_build "$@" ;;
  *) die "unknown command '$1' (download, env or build)" ;;
esac
