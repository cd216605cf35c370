#!/usr/bin/env bash
# Where the time of each issue-12 kernel that misses its DESIGN §7 target goes, from Nsight Compute
# (`--clock-control none`: the clocks the benches run at) over the production `dayzero bench` cases:
# per profiled launch its duration, SM / tensor-pipe / L1 / L2 / DRAM throughput, issue activity,
# occupancy and its largest warp-stall reasons (scripts/ncu_targets.py). On the GPU node, from the
# repository root, after the project's GPU build (build-gpu/), with the offline prefix's env set:
#   OUT=<dir> [NCU_ONLY="<target> ..."] [NCU_SOURCE="<target> ..."] [NCU_BUDGET=<s>] bash scripts/ncu-targets.sh
# writes <dir>/ncu_targets_raw_<target>.csv and <dir>/ncu_targets.json / .txt (commit from DZ_COMMIT);
# for the targets in NCU_SOURCE also the SASS instructions of the case's first launch with the most
# warp-stall samples (SourceCounters; scripts/ncu_source_top.py), in <dir>/ncu_source.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
O=${OUT:?set OUT}
mkdir -p "$O"
BIN=${DZ_BIN:-build-gpu/dayzero}
# target | bench | DZ_BENCH_ONLY (the case) | kernels (ncu regex) | launches profiled
# (ncu serialises and flushes caches between launches, so the first call of a case, its warm-up, is as
# good as any; the counts cover one call: prep + recurrence for the serial prefill, the scan's segment
# bounds, prep, two transition passes, merge and output pass, the indexer's query blocks)
TARGETS='kda|linear-attn|kda_chunk_serial H=32|mma_prep_kernel|rec_wgmma_kernel|mma_rec_kernel|mma_out_kernel|2
gdn|linear-attn|gdn_chunk_serial H=32|mma_prep_kernel|rec_wgmma_kernel|mma_rec_kernel|mma_out_kernel|2
scan8|linear-attn|kda_chunk_parallel_scan H=8|mma_prep_kernel|rec_wgmma_kernel|mma_rec_kernel|mma_out_kernel|merge_kernel|segment_bounds_kernel|6
indexer|sparse-attn|indexer_bf16|idx_wgmma_kernel|topk_hist_kernel|topk_smem_kernel|8
mla_prefill|sparse-attn|mla_prefill_bf16|sparse_mla|combine_kernel|2
mla_decode_fp8|sparse-attn|mla_decode_fp8|sparse_mla|combine_kernel|2'
# Sections rather than metric names: a metric the device's ncu does not know fails the whole run, a
# section lists what it has (the tensor pipes are named differently across ncu versions).
SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats)
command -v ncu >/dev/null || { echo "ncu-targets: no ncu on PATH" >&2; exit 1; }
[[ -x $BIN ]] || { echo "ncu-targets: $BIN is not built" >&2; exit 1; }
T0=$(date +%s)
BUDGET=${NCU_BUDGET:-400}  # s for all targets; one target at most 150
while IFS= read -r line; do
  t=${line%%|*}
  rest=${line#*|}
  bench=${rest%%|*}
  rest=${rest#*|}
  only=${rest%%|*}
  rest=${rest#*|}
  count=${rest##*|}
  regex=${rest%|*}
  [[ -n ${NCU_ONLY:-} && " $NCU_ONLY " != *" $t "* ]] && continue
  lim=$((BUDGET - ($(date +%s) - T0)))
  ((lim > 150)) && lim=150
  ((lim < 20)) && { echo "ncu $t: skipped, the budget is spent"; continue; }
  DZ_BENCH_ONLY=$only timeout "$lim" ncu --clock-control none --csv --page raw --kernel-name "regex:$regex" \
    --launch-count "$count" "${SECTIONS[@]}" \
    "$BIN" bench "$bench" >"$O/ncu_targets_raw_$t.csv" 2>"$O/ncu_targets_err_$t.txt"
  echo "ncu $t rc $?"
  if [[ " ${NCU_SOURCE:-} " == *" $t "* ]] && (($(date +%s) - T0 < BUDGET - 40)); then
    DZ_BENCH_ONLY=$only timeout 120 ncu --clock-control none --kernel-name "regex:$regex" --launch-count 1 \
      --section SourceCounters --section WarpStateStats -o "$O/ncu_source_$t" -f "$BIN" bench "$bench" \
      >"$O/ncu_source_run_$t.txt" 2>&1
    ncu -i "$O/ncu_source_$t.ncu-rep" --page source --csv --print-source sass >"$O/ncu_source_$t.csv" 2>/dev/null
    { echo "== $t: $only, first launch of $regex"; python3 scripts/ncu_source_top.py "$O/ncu_source_$t.csv" "sass instruction" 30; } \
      >>"$O/ncu_source.txt" 2>&1
    echo "ncu source $t rc $?"
  fi
done <<<"$TARGETS"
python3 scripts/ncu_targets.py "$O" "$O/ncu_targets.json" | tee "$O/ncu_targets.txt"
[[ -f $O/ncu_source.txt ]] && cat "$O/ncu_source.txt"
