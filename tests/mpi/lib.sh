# Shared by the mpi test scripts: $1 = dayzero binary, $2 = source dir.
set -euo pipefail
DZ=$1
SRC=$2
source "$SRC/scripts/env.sh"
source "$SRC/tests/h5_checks.sh"  # same, ndone
# DZ_TEST_BACKEND=cpu|cuda (default cpu): "${BACKEND[@]}" is --backend for the scripts that honour it
# (resume.sh); the others run on the CPU as before
BACKEND=(--backend "${DZ_TEST_BACKEND:-cpu}")
W=$(mktemp -d /tmp/dz_mpi_XXXXXX)
trap 'rm -rf "$W"' EXIT
say() { echo "[$(basename "$0" .sh)] $*"; }
mpi() { local np=$1; shift; mpirun -np "$np" --oversubscribe "$DZ" "$@"; }
# documents of edge lengths (1, 2, 3, 7, 64, 65, 130) plus random ones, as a token file
edge_tokens() {  # $1 = vocab, $2 = file, $3 = random docs
  python3 - "$1" "$2" "${3:-12}" <<'PY'
import random, sys
V, path, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
rng = random.Random(5)
lens = [1, 2, 3, 7, 64, 65, 130] + [rng.randint(1, 200) for _ in range(n)]
with open(path, "w") as f:
    for L in lens:
        f.write(" ".join(str(rng.randrange(V)) for _ in range(L)) + "\n")
PY
}
