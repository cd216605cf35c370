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
# 2026-12-06: only "Line No | Source"), per SASS instruction instead (scripts/ncu_source_top.py). The
# CSVs come back xz-compressed.
for view in cuda sass; do
  ncu -i "$O/prof.ncu-rep" --page source --csv --print-source $view > "$O/source_$view.csv" 2> "$O/source_err.txt" ||
    { echo "per-$view export failed:"; head -3 "$O/source_err.txt"; continue; }
  python3 scripts/ncu_source_top.py "$O/source_$view.csv" "$view line" && break
done
xz -f "$O"/source_*.csv
