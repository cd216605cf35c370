#!/usr/bin/env bash
# The GPU tests, on a GPU node (DESIGN §8: no package mirror needed): builds dayzero and the gpu
# label against an offline prefix, runs the GPU test binary (Catch2 test specs may follow), then
# `dayzero run` on the golden kimi_linear and qwen3_next models with --backend cpu and --backend cuda
# (one rank, and two ranks sharing the GPU) and prints how far the cuda log-probs are from the cpu
# ones.
#   bash scripts/gpu-tests.sh PREFIX BUILD_DIR LOG_DIR [test specs...]
set -euo pipefail
cd "$(dirname "$0")/.."
P=${1:?prefix dir}; B=${2:?build dir}; L=${3:?log dir}
shift 3
mkdir -p "$L"
DZ_TARGETS="dayzero dz_gpu_tests" bash scripts/offline-prefix.sh build "$P" "$B" 2>&1 | grep -E '^\[offline-prefix\]|error|FAILED' | tee "$L/build.log"
eval "$(bash scripts/offline-prefix.sh env "$P")"
set +e
"$B/tests/dz_gpu_tests" --use-colour no "$@" 2>&1 | tee "$L/gpu_tests.log"
rc=${PIPESTATUS[0]}
set -e
EXE=$B/dayzero
W=$(mktemp -d)
for fam in kimi_linear qwen3_next; do
  M=tests/golden/$fam
  "$EXE" make-input --model "$M" --docs 12 --min-len 1 --max-len 700 --seed 5 --out "$W/$fam.in.h5" >/dev/null
  "$EXE" run --model "$M" --input "$W/$fam.in.h5" --output "$W/$fam.cpu.h5" --backend cpu >/dev/null
  "$EXE" run --model "$M" --input "$W/$fam.in.h5" --output "$W/$fam.cuda.h5" --backend cuda \
    --report "$W/$fam.report.json" | tail -2
  mpirun -np 2 "$EXE" run --model "$M" --input "$W/$fam.in.h5" --output "$W/$fam.dp2.h5" --backend cuda >/dev/null
  # CP x TP with the ranks sharing the one GPU (collectives through MPI, staged via pinned memory)
  for lay in "2 --cp 2" "2 --tp 2" "4 --cp 2 --tp 2"; do
    set -- $lay
    n=$1; shift
    mpirun -np "$n" "$EXE" run --model "$M" --input "$W/$fam.in.h5" --output "$W/$fam.np$n${1#--}${2:-}${3#--}${4:-}.h5" \
      --backend cuda "$@" >/dev/null
  done
  python3 - "$W" "$fam" <<'PY' | tee -a "$L/cli.log"
import sys, glob, json, h5py, numpy as np
w, fam = sys.argv[1:3]
lp = lambda p: h5py.File(p, "r")["/logprobs"][:]
a, b = lp(f"{w}/{fam}.cpu.h5"), lp(f"{w}/{fam}.cuda.h5")
d = np.abs(a - b)
tol = json.load(open("tests/golden/bf16_drift.json"))[fam]
print(f"cli {fam}: {a.size} log-probs, cuda vs cpu mean |dlp| {d.mean():.3g} max {d.max():.3g} "
      f"(transformers bf16 vs fp32 on its golden docs: mean {tol['mean_abs']:.3g} max {tol['max_abs']:.3g}); "
      f"dp2 == 1 rank: {bool(np.array_equal(b, lp(f'{w}/{fam}.dp2.h5')))}")
for p in sorted(glob.glob(f"{w}/{fam}.np*.h5")):
    e = np.abs(lp(p) - b)
    print(f"cli {fam} {p.split('.')[-2]} vs 1 rank (cuda): mean |dlp| {e.mean():.3g} max {e.max():.3g}")
PY
  python3 -c "import json,sys; r=json.load(open('$W/$fam.report.json')); print('report:', {k: r[k] for k in ('tokens','seconds') if k in r}, [(x.get('device'), x.get('peak_device_memory_bytes')) for x in r.get('per_rank', [])])" | tee -a "$L/cli.log"
done
rm -rf "$W"
exit "$rc"
