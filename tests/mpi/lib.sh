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
# repetitive documents (a random block repeated: n-gram and MTP drafts find matches) and random ones
# (lengths 1 .. 130), as a token file: $1 = vocab size or a model directory (its config.json), $2 = file
rep_tokens() {
  python3 - "$1" "$2" <<'PY'
import json, os, random, sys
a, path = sys.argv[1:]
if os.path.isdir(a):
    c = json.load(open(a + "/config.json"))
    V = (c.get("text_config") or c)["vocab_size"]
else:
    V = int(a)
rng = random.Random(3)
docs = []
for L, blk in [(40, 5), (71, 9), (2, 2), (130, 13), (17, 4)]:
    b = [rng.randrange(V) for _ in range(blk)]
    docs.append((b * (L // blk + 1))[:L])
docs += [[rng.randrange(V) for _ in range(L)] for L in (1, 33, 90)]
with open(path, "w") as f:
    for d in docs:
        f.write(" ".join(map(str, d)) + "\n")
PY
}
# killed_run N NP OUT ARGS...: `dayzero run ARGS --output OUT` on NP ranks, its writer killed
# (SIGKILL) after N documents; OUT.part must be left behind for a --resume
killed_run() {
  local n=$1 np=$2 out=$3
  shift 3
  set +e
  DAYZERO_FAULT_KILL_AFTER_DOCS=$n mpi "$np" run "$@" --output "$out" 2>/dev/null
  set -e
  [ -e "$out.part" ] || { echo "FAIL: no .part after the kill"; exit 1; }
}
