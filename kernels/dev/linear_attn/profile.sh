#!/bin/bash
# On the GPU machine, from the repository root: where the KDA prep kernel's time goes (mma_prep_kernel:
# 1.18 ms a layer of GLM-5.3-Flash's forward at T = 8192, 3-4x its roofline; docs/cuda_linear_attention.md
# has the last profile, b2f09e7). Builds the dev harness with -lineinfo (run_gpu.sh BUILD_ONLY=1), then ncu
# over the first mma_prep_kernel launch of its bench (KDA, H = 32, T = 65536: GLM's per-layer work x 4):
# speed of light, occupancy, warp states, and the stall samples per CUDA source line, summarised; the raw
# reports stay under $OUT.   bash kernels/dev/linear_attn/profile.sh
# LA_PROF_KERNEL / LA_PROF_SKIP: another kernel and how many of its launches to skip first, e.g. the
# wgmma recurrence at H = 32, outputs fused (the bench's first launch of it):
#   LA_PROF_KERNEL=rec_wgmma_kernel bash kernels/dev/linear_attn/profile.sh
O=${OUT:-/tmp/la_prof}
B=${BUILD_DIR:-/tmp/la_build}
mkdir -p "$O"
EXTRA_NVFLAGS=-lineinfo BUILD_ONLY=1 OUT=$O BUILD_DIR=$B bash kernels/dev/linear_attn/run_gpu.sh || exit 1
KN=${LA_PROF_KERNEL:-mma_prep_kernel}
timeout 300 ncu --kernel-name "regex:$KN" --launch-skip "${LA_PROF_SKIP:-0}" --launch-count 1 --import-source yes \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis --section SourceCounters -o "$O/prof" -f "$B/la" --bench > "$O/ncu_run.txt" 2>&1
echo "ncu rc $?"
ncu -i "$O/prof.ncu-rep" --page details > "$O/details.txt" 2>&1
grep -m1 -E "$KN" "$O/details.txt"
grep -E "Duration|Achieved Occupancy|Registers Per|Theoretical Occ|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$O/details.txt" | head -20
# Stall samples per CUDA source line; when that view has no metric columns (ncu 2025.3 on the H100,
# 2026-12-06: only "Line No | Source"), per SASS instruction instead. The CSVs come back xz-compressed.
summarise() {  # $1: the CSV, $2: what a row is
python3 - "$1" "$2" <<'PY'
import csv, sys
try:
    rows = list(csv.reader(open(sys.argv[1])))
except OSError:
    sys.exit("no " + sys.argv[1])
hi = next((i for i, r in enumerate(rows) if any(c.strip() in ("Source", "# Source", "Address") for c in r)), None)
if hi is None:
    sys.exit("no header in the CSV: " + " | ".join(rows[0][:6]) if rows else "empty CSV")
h = rows[hi]
def col(*keys):
    for i, c in enumerate(h):
        if all(k.lower() in c.lower() for k in keys): return i
    return None
src, samp = col("source"), col("stall", "sampling", "all") or col("sampling", "all") or col("samples")
line = col("line") or col("address") or 0
if samp is None:
    sys.exit("no stall-sampling column: " + " | ".join(h))
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
body = [r for r in rows[hi + 1:] if len(r) > max(samp, src or 0)]
tot = sum(num(r[samp]) for r in body) or 1.0
print(f"stall samples per {sys.argv[2]} ({h[samp]}), top 40 of {int(tot)}:")
for r in sorted(body, key=lambda r: -num(r[samp]))[:40]:
    print(f"  {100 * num(r[samp]) / tot:5.1f} %  {r[line]:>6}  {(r[src] if src is not None else '').strip()[:110]}")
PY
}
for view in cuda sass; do
  ncu -i "$O/prof.ncu-rep" --page source --csv --print-source $view > "$O/source_$view.csv" 2> "$O/source_err.txt" ||
    { echo "per-$view export failed:"; head -3 "$O/source_err.txt"; continue; }
  summarise "$O/source_$view.csv" "$view line" && break
done
xz -f "$O"/source_*.csv
