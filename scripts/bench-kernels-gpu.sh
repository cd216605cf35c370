#!/usr/bin/env bash
# Issue 12's kernel benches side by side in ONE command on the GPU machine: `dayzero bench linear-attn`,
# `sparse-attn` and `dense-attn` beside fla's Triton kernels (docs/perf/fla_bench.py, fla as source on
# the PYTHONPATH) and PyTorch (docs/perf/kernel_anchors.py: SDPA's flash backend for dense causal
# attention, the naive indexer), then the table against DESIGN §7's targets (scripts/kernel_table.py,
# also as LOG_DIR/kernel_table.md). JSON into LOG_DIR.
#   bash scripts/bench-kernels-gpu.sh PREFIX BUILD_DIR LOG_DIR FLA_SRC [parts...]
# parts: linear sparse dense fla torch (default: all; ~1 min of dayzero, ~3 min of fla with its Triton
# compiles, ~1 min of PyTorch on an H200). Pass DZ_COMMIT=<hash>: the device tool's copy of the tree
# can carry stale git metadata.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${1:?prefix}; B=${2:?build dir}; L=${3:?log dir}; FLA=${4:?fla source dir}
shift 4
parts=${*:-linear sparse dense fla torch}
has() { [[ " $parts " == *" $1 "* ]]; }
mkdir -p "$L"
[[ -x $B/dayzero ]] || DZ_TARGETS="dayzero" bash scripts/offline-prefix.sh build "$P" "$B" 2>&1 | grep -E '^\[offline-prefix\]|error'
eval "$(bash scripts/offline-prefix.sh env "$P")"
export DZ_COMMIT=${DZ_COMMIT:-unknown}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
rc=0
for k in linear sparse dense; do
  has $k || continue
  t0=$(date +%s)
  "$B/dayzero" bench $k-attn --json "$L/${k}_attn_dayzero.json" > "$L/${k}_attn_dayzero.log" 2>&1 || { echo "dayzero bench $k-attn failed:"; tail -5 "$L/${k}_attn_dayzero.log"; rc=1; }
  echo "dayzero bench $k-attn: $(($(date +%s) - t0)) s"
done
if has fla; then
  # the anchor must run fla's kernels, not a fallback: fail loudly when fla does not import
  if PYTHONPATH="$FLA" python3 -c "import fla.ops.kda, fla.ops.gated_delta_rule"; then
    t0=$(date +%s)
    PYTHONPATH="$FLA${PYTHONPATH:+:$PYTHONPATH}" python3 docs/perf/fla_bench.py "$L/linear_attn_fla.json" > "$L/fla.log" 2>&1 ||
      { echo "fla_bench failed:"; tail -5 "$L/fla.log"; rc=1; }
    echo "fla: $(($(date +%s) - t0)) s"
  else
    echo "bench-kernels-gpu: fla does not import from $FLA (PYTHONPATH must hold the directory that contains fla/)"; rc=1
  fi
fi
if has torch; then
  t0=$(date +%s)
  python3 docs/perf/kernel_anchors.py "$L/kernel_anchors.json" > "$L/kernel_anchors.log" 2>&1 ||
    { echo "kernel_anchors failed:"; tail -5 "$L/kernel_anchors.log"; rc=1; }
  echo "torch anchors: $(($(date +%s) - t0)) s"
fi
python3 scripts/kernel_table.py "$L" || rc=1
python3 scripts/kernel_table.py "$L" --markdown > "$L/kernel_table.md" || true
exit $rc
