#!/usr/bin/env bash
# Issue 14 item 3 in ONE command on a node with several GPUs: the scaling runs, one rank per GPU
# (NCCL between them, NVLink multicast off), each a `dayzero run --dummy-weights --report` into
# RESULTS/<part>/; then slurm/summarize.py's table, CSV and PNG per part and the targets
# (scripts/scaling_targets.py, also as RESULTS/targets.md).
#   bash scripts/bench-scaling-gpu.sh PREFIX BUILD_DIR RESULTS [parts...]
# PREFIX: the offline prefix (scripts/offline-prefix.sh), or "-" for the environment as it is
# (scripts/env.sh: this machine, the smoke test). parts (default: cp dp tp ep):
#   cp: one document of DZ_CP_TOKENS (131072) on each of DZ_CP_MODELS (configs/bench
#       kimi_linear_48b_a3b, or its 8-layer cut on cards under 100 GB, and qwen3_next_80b_a3b_8l) at
#       CP = 1, 2, 4, 8 (up to the GPUs); with 8 GPUs
#       also one of 4 x DZ_CP_TOKENS (524288) at CP = 4 and 8 (CP = 1 cannot hold it)
#   dp: DZ_DP_DOCS (256) documents of 2048 tokens on DZ_DP_MODEL (qwen3_next_80b_a3b_8l), packed
#       (--max-batch-tokens 32768), at DP = 1, 2, 4, 8
#   tp: the whole Qwen3-Next-80B-A3B (configs/bench/qwen3_next_80b_a3b: 48 layers, ~160 GB of bf16
#       weights, more than one GPU holds) at TP = 2, 4, 8 on DZ_TP_DOCS (8) documents of 8192 tokens
#   ep: DZ_EP_MODEL (qwen3_next_80b_a3b_8l), one document of 32768 tokens: --tp G against
#       --tp G --ep G, and --cp G against --cp G --ep G (G = the GPUs, at most 4 in each group)
# DZ_GPUS: how many GPUs to use (default: all that nvidia-smi lists). DZ_SCALING_SMOKE=1: the same
# plumbing on CPU ranks with the demo preset and small documents (--backend cpu, DZ_GPUS ranks,
# default 4): what ctest's scaling_smoke runs; its numbers mean nothing. Pass DZ_COMMIT=<hash>.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${1:?prefix or -}; B=${2:?build dir}; R=${3:?results dir}
shift 3
parts=${*:-cp dp tp ep}
has() { [[ " $parts " == *" $1 "* ]]; }
if [[ $P != - ]]; then
  [[ -x $B/dayzero ]] || DZ_TARGETS="dayzero" bash scripts/offline-prefix.sh build "$P" "$B" 2>&1 | grep -E '^\[offline-prefix\]|error'
  eval "$(bash scripts/offline-prefix.sh env "$P")"
else
  source scripts/env.sh
fi
DZ=$B/dayzero
SMOKE=${DZ_SCALING_SMOKE:-0}
mkdir -p "$R"
W=$(mktemp -d /tmp/dz_scaling_XXXXXX)
trap 'rm -rf "$W"' EXIT
if [[ $SMOKE == 1 ]]; then
  G=${DZ_GPUS:-4}
  BK=cpu
  "$DZ" make-model --preset demo --out "$W/demo" >/dev/null
  CP_MODELS=("$W/demo") CP_TOKENS=512 DP_MODEL=$W/demo DP_DOCS=16 DP_LEN=64 TP_MODEL=$W/demo TP_DOCS=2 TP_LEN=256
  EP_MODEL=$W/demo EP_LEN=512 DUMMY=() TP_MAX=2  # the demo model's 2 heads: TP and EP up to 2
else
  G=${DZ_GPUS:-$(nvidia-smi --list-gpus | wc -l)}
  BK=cuda
  # the whole Kimi-Linear-48B-A3B at 131072 tokens peaks at 98 GiB on one GPU (docs/perf): on
  # smaller cards (an H100's 80 GB) its 8-layer cut
  gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  kimi=configs/bench/kimi_linear_48b_a3b
  ((gib < 100000)) && kimi=configs/bench/kimi_linear_48b_a3b_8l
  read -r -a CP_MODELS <<<"${DZ_CP_MODELS:-$kimi configs/bench/qwen3_next_80b_a3b_8l}"
  CP_TOKENS=${DZ_CP_TOKENS:-131072} DP_MODEL=${DZ_DP_MODEL:-configs/bench/qwen3_next_80b_a3b_8l} DP_DOCS=${DZ_DP_DOCS:-256}
  DP_LEN=2048 TP_MODEL=configs/bench/qwen3_next_80b_a3b TP_DOCS=${DZ_TP_DOCS:-8} TP_LEN=8192
  EP_MODEL=${DZ_EP_MODEL:-configs/bench/qwen3_next_80b_a3b_8l} EP_LEN=32768 DUMMY=(--dummy-weights) TP_MAX=8
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
fi
export NCCL_NVLS_ENABLE=0
python3 - "$R/manifest.json" "$G" "$BK" "$SMOKE" <<'PY'
import json, os, subprocess, sys, time
dev = "cpu ranks (smoke)"
if sys.argv[3] == "cuda":
    try:
        dev = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        dev = "unknown"
json.dump(dict(commit=os.environ.get("DZ_COMMIT", "unknown"), device=dev, gpus=int(sys.argv[2]),
               backend=sys.argv[3], smoke=sys.argv[4] == "1",
               date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())), open(sys.argv[1], "w"), indent=1)
PY
rc=0
# one run: $1 = part, $2 = name, $3 = ranks, $4 = model, $5 = input, then dayzero options
run() {
  local part=$1 name=$2 np=$3 model=$4 in=$5
  shift 5
  mkdir -p "$R/$part"
  local t0
  t0=$(date +%s)
  if mpirun -np "$np" --oversubscribe -x NCCL_NVLS_ENABLE "$DZ" run --model "$model" "${DUMMY[@]}" --input "$in" \
       --output "$W/$part.$name.h5" --backend "$BK" --report "$R/$part/$name.json" --overwrite "$@" \
       >"$R/$part/$name.log" 2>&1; then
    echo "[scaling] $part $name: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"{r['tokens_per_s']:.0f} tokens/s over {r['seconds']:.2f} s\")" "$R/$part/$name.json") ($(($(date +%s) - t0)) s with loading)"
  else
    echo "[scaling] $part $name FAILED (log: $R/$part/$name.log):"; tail -3 "$R/$part/$name.log"; rc=1
  fi
  rm -f "$W/$part.$name.h5"
}
docs() {  # $1 = file, $2 = documents, $3 = length, $4 = model (its vocabulary)
  "$DZ" make-input --out "$1" --docs "$2" --min-len "$3" --max-len "$3" --model "$4" --overwrite >/dev/null
}
ways() { local n; for n in 1 2 4 8; do ((n <= G)) && echo $n; done; }
if has cp; then
  for m in "${CP_MODELS[@]}"; do
    b=$(basename "$m")
    docs "$W/cp_$b.h5" 1 "$CP_TOKENS" "$m"
    for c in $(ways); do run cp "${b}_T${CP_TOKENS}_cp$c" "$c" "$m" "$W/cp_$b.h5" --cp "$c" --mode logprobs; done
    if ((G >= 8)) && [[ $SMOKE != 1 ]]; then
      docs "$W/cp4x_$b.h5" 1 $((4 * CP_TOKENS)) "$m"
      for c in 4 8; do run cp "${b}_T$((4 * CP_TOKENS))_cp$c" "$c" "$m" "$W/cp4x_$b.h5" --cp "$c" --mode logprobs; done
    fi
  done
fi
if has dp; then
  docs "$W/dp.h5" "$DP_DOCS" "$DP_LEN" "$DP_MODEL"
  for n in $(ways); do run dp "$(basename "$DP_MODEL")_docs${DP_DOCS}x${DP_LEN}_dp$n" "$n" "$DP_MODEL" "$W/dp.h5" --max-batch-tokens 32768; done
fi
if has tp; then
  docs "$W/tp.h5" "$TP_DOCS" "$TP_LEN" "$TP_MODEL"
  for t in $(ways); do
    ((t > TP_MAX)) && continue
    ((t == 1)) && [[ $SMOKE != 1 ]] && continue  # the whole 80B model does not fit one GPU
    run tp "$(basename "$TP_MODEL")_docs${TP_DOCS}x${TP_LEN}_tp$t" "$t" "$TP_MODEL" "$W/tp.h5" --tp "$t"
  done
fi
if has ep; then
  e=$((G >= 4 ? 4 : G))
  ((e > TP_MAX)) && e=$TP_MAX
  if ((e >= 2)); then
    docs "$W/ep.h5" 1 "$EP_LEN" "$EP_MODEL"
    b=$(basename "$EP_MODEL")
    run ep "${b}_tp${e}" "$e" "$EP_MODEL" "$W/ep.h5" --tp "$e"
    run ep "${b}_tp${e}_ep${e}" "$e" "$EP_MODEL" "$W/ep.h5" --tp "$e" --ep "$e"
    run ep "${b}_cp${e}" "$e" "$EP_MODEL" "$W/ep.h5" --cp "$e"
    run ep "${b}_cp${e}_ep${e}" "$e" "$EP_MODEL" "$W/ep.h5" --cp "$e" --ep "$e"
  fi
fi
for part in cp dp tp ep; do
  [[ -d $R/$part ]] || continue
  echo "== $part"
  python3 slurm/summarize.py "$R/$part" --plot "$R/$part/scaling.png" --csv "$R/$part/scaling.csv" || rc=1
done
python3 scripts/scaling_targets.py "$R" || rc=1
python3 scripts/scaling_targets.py "$R" --markdown >"$R/targets.md" || true
exit $rc
