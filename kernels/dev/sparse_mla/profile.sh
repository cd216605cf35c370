#!/bin/bash
# On the GPU machine, from the repository root: where the wgmma sparse MLA's time goes, for the
# next design step (docs/cuda_backend.md: sparse MLA at 450 TFLOP/s). ncu over one launch of
# GLM-5.3-Flash's DSA shape (64 heads, R 512, Top-2048, 8192 queries): speed of light, pipes, shared
# memory wavefronts and the warp stall reasons, summarised; the raw CSV stays under $OUT.
#   bash kernels/dev/sparse_mla/profile.sh [variant.cu]   (default: production's kernel)
O=${OUT:-/tmp/smla_prof}
mkdir -p "$O"
src=${1:-kernels/sparse_mla_wgmma.cu}
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -lineinfo -Ikernels -Ilib kernels/dev/sparse_mla/test_sparse_mla.cu \
  kernels/sparse_mla.cu "$src" -o /tmp/smla_prof > "$O/build.txt" 2>&1 || { grep error "$O/build.txt" | head; exit 1; }
# the first launch of the bench is GLM's warm-up call
timeout 240 ncu --csv --page raw --kernel-name regex:sparse_mla_wgmma --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section Occupancy \
  /tmp/smla_prof --bench --nocheck > "$O/ncu_raw.csv" 2> "$O/ncu_err.txt"
echo "ncu rc $?"
python3 - "$O/ncu_raw.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 5]
if len(rows) < 3:
    sys.exit("no ncu rows (see ncu_err.txt)")
h, units, v = rows[0], rows[1], rows[2]
m = {h[i]: (v[i], units[i]) for i in range(len(h))}
def show(part, top=None):
    items = [(k, val, u) for k, (val, u) in m.items() if part in k]
    if top:
        def num(x):
            try: return float(x.replace(",", ""))
            except ValueError: return 0.0
        items = sorted(items, key=lambda t: -num(t[1]))[:top]
    for k, val, u in items:
        print(f"  {k} = {val} {u}")
for k in ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
          "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
          "lts__throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
          "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
          "smsp__issue_active.avg.pct_of_peak_sustained_active", "sm__warps_active.avg.pct_of_peak_sustained_active"):
    if k in m: print(f"{k} = {m[k][0]} {m[k][1]}")
print("warp stall reasons (the WarpStateStats metrics, largest first):")
show("issue_stalled", top=14)
PY
