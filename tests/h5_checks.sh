# Sourced by the test-script libraries (tests/{mpi,crash,slurm}/lib.sh): checks on dayzero's HDF5
# outputs. Not a test itself.

# same A.h5 B.h5 dataset...: the datasets are bitwise equal (else the first differences, FAIL, exit 1)
same() {
  local a=$1 b=$2 d; shift 2
  for d in "$@"; do
    if ! h5diff -q "$a" "$b" "$d" "$d"; then
      h5diff -r "$a" "$b" "$d" "$d" | head -20
      echo "FAIL: $d differs between $a and $b"; exit 1
    fi
  done
}
# ndone FILE: documents whose /done flag is set (0 when the file is not readable yet)
ndone() { { h5dump -d /done -y -w 0 "$1" 2>/dev/null || true; } | grep -o '\b1\b' | wc -l; }
# supports_stop: the dayzero in $DZ has the clean SIGTERM stop path (--stop-grace)
supports_stop() { "$DZ" run --help 2>&1 | grep -q -- --stop-grace; }
