# Sourced by the test-script libraries (tests/{mpi,crash,slurm}/lib.sh): checks on dayzero's HDF5
# outputs. Not a test itself.

# Both checks use hdf5-tools (h5diff, h5dump) when installed; without them (scripts/offline-prefix.sh,
# used on the GPU node, does not carry hdf5-tools), or with DZ_H5PY=1, python3 + h5py: `same` then
# compares dtype, shape and bytes, `ndone` counts the flags equal to 1.
_h5py() { [ "${DZ_H5PY:-0}" = 1 ] || ! command -v "$1" >/dev/null; }

# same A.h5 B.h5 dataset...: the datasets are bitwise equal (else the first differences, FAIL, exit 1)
same() {
  local a=$1 b=$2 d; shift 2
  if _h5py h5diff; then
    python3 - "$a" "$b" "$@" <<'PY' || exit 1
import sys, h5py, numpy as np
a, b = sys.argv[1:3]
with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
    for d in sys.argv[3:]:
        x, y = fa[d][()], fb[d][()]
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            print(f"{d}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}")
            if x.dtype == y.dtype and x.shape == y.shape and x.size:  # the first differing elements
                xf, yf = np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(y).reshape(-1)
                bad = (xf.view(np.uint8).reshape(x.size, -1) != yf.view(np.uint8).reshape(x.size, -1)).any(1)
                for j in np.flatnonzero(bad)[:20]:
                    print(f"  [{j}] {xf[j]!r} {yf[j]!r}")
            print(f"FAIL: {d} differs between {a} and {b}")
            sys.exit(1)
PY
    return 0
  fi
  for d in "$@"; do
    if ! h5diff -q "$a" "$b" "$d" "$d"; then
      h5diff -r "$a" "$b" "$d" "$d" | head -20
      echo "FAIL: $d differs between $a and $b"; exit 1
    fi
  done
}
# ndone FILE: documents whose /done flag is set (0 when the file is not readable yet)
ndone() {
  if _h5py h5dump; then
    python3 -c 'import sys, h5py; print(int((h5py.File(sys.argv[1], "r")["done"][()] == 1).sum()))' "$1" 2>/dev/null ||
      echo 0
    return 0
  fi
  { h5dump -d /done -y -w 0 "$1" 2>/dev/null || true; } | grep -o '\b1\b' | wc -l
}
# supports_stop: the dayzero in $DZ has the clean SIGTERM stop path (--stop-grace)
supports_stop() { "$DZ" run --help 2>&1 | grep -q -- --stop-grace; }
