#!/usr/bin/env bash
# DeepSeek FP8 checkpoints (E4M3 weights with 128x128 block scale_inv) on the CPU backend: a model
# written by scripts/fp8_checkpoint.py scores exactly as its dequantised fp32 copy (the loader
# decodes code * scale in fp32; the CPU reference computes from those values), under TP 2 as on one
# rank, and the load log counts the FP8 tensors (none kept in FP8 on the CPU). The GPU keeps them in
# FP8 (scripts/gpu-tests.sh runs the same model there).
source "$(dirname "$0")/lib.sh"
"$DZ" make-model --preset "$SRC/tests/mpi/fp8_deepseek.json" --out "$W/f32" >/dev/null
python3 "$SRC/scripts/fp8_checkpoint.py" "$W/f32" "$W/fp8" --dequantized "$W/deq"
edge_tokens 256 "$W/t.txt" 4
"$DZ" make-input --tokens-file "$W/t.txt" --out "$W/in.h5" >/dev/null
mpi 1 run --model "$W/fp8" --input "$W/in.h5" --output "$W/fp8.h5" 2>"$W/log"
grep -q "FP8 block-scaled weights: [1-9][0-9]* in the checkpoint, 0 kept in FP8 on cpu" "$W/log" ||
  { cat "$W/log"; echo "FAIL: no FP8 load line"; exit 1; }
mpi 1 run --model "$W/deq" --input "$W/in.h5" --output "$W/deq.h5" 2>/dev/null
h5diff "$W/fp8.h5" "$W/deq.h5" /logprobs /logprobs >/dev/null || { echo "FAIL: FP8 checkpoint != its dequantised copy"; exit 1; }
mpi 2 run --model "$W/fp8" --input "$W/in.h5" --output "$W/fp8_tp2.h5" --tp 2 2>/dev/null
h5diff -d 1e-4 "$W/fp8.h5" "$W/fp8_tp2.h5" /logprobs /logprobs >/dev/null || { echo "FAIL: FP8 TP 2 != 1 rank"; exit 1; }
# `dayzero plan` counts the weights the GPU keeps in FP8 at 1 byte (+ block scales): the 30 dense
# linear ones of this model (the routed experts stack in BF16); the CPU plan is fp32 either way.
for m in fp8 deq; do
  for b in cuda cpu; do "$DZ" plan --model "$W/$m" --cp 1 --length 1024 --backend $b --json >"$W/plan.$m.$b.json" 2>/dev/null; done
done
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
m = {(a, b): json.load(open(f"{w}/plan.{a}.{b}.json"))["memory"] for a in ("fp8", "deq") for b in ("cuda", "cpu")}
f, d = m["fp8", "cuda"], m["deq", "cuda"]
assert f["fp8_block_weights"] == 78 and f["fp8_weights_kept"] == 30 and d["fp8_weights_kept"] == 0, (f, d)
assert f["detail_gib"]["weights_experts"] == d["detail_gib"]["weights_experts"], (f, d)
assert 0.45 < f["detail_gib"]["weights_other"] / d["detail_gib"]["weights_other"] < 0.6, (f, d)
assert m["fp8", "cpu"]["weights_gib"] == m["deq", "cpu"]["weights_gib"] and m["fp8", "cpu"]["fp8_weights_kept"] == 0
print("plan: FP8 checkpoint on cuda", round(f["weights_gib"] * 2**20, 2), "MiB of weights vs",
      round(d["weights_gib"] * 2**20, 2), "MiB for its BF16 copy (30 weights in FP8)")
PY
say "FP8 checkpoint: equal to its dequantised copy, TP 2 within 1e-4: $(grep -o 'FP8 block-scaled weights: [0-9]* in the checkpoint' "$W/log")"
