#!/usr/bin/env bash
# The main job on the embedded default: the tiny `demo` preset (KDA + MLA/DSA + Block AttnRes +
# MoE), synthetic documents, several MPI ranks on the CPU.
# Usage: scripts/demo.sh [ranks]   (default 4)
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${1:-4}
bash scripts/setup.sh
source scripts/env.sh
OUT=${DZ_DEMO_DIR:-demo-out}
mkdir -p "$OUT"
./build/dayzero make-model --preset demo --out "$OUT/model" --overwrite
./build/dayzero make-input --model "$OUT/model" --docs 40 --min-len 1 --max-len 300 --out "$OUT/input.h5" --overwrite
mpirun -np "$NP" --oversubscribe ./build/dayzero run --model "$OUT/model" --input "$OUT/input.h5" \
  --output "$OUT/logprobs.h5" --overwrite --report "$OUT/report.json"
python3 - "$OUT/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"[demo] {r['documents']} documents, {r['tokens']} tokens in {r['seconds']:.2f} s "
      f"({r['tokens_per_s']:.0f} tok/s) on {r['world_size']} ranks -> {r['output']}")
PY
h5ls "$OUT/logprobs.h5"
