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
say "FP8 checkpoint: equal to its dequantised copy, TP 2 within 1e-4: $(grep -o 'FP8 block-scaled weights: [0-9]* in the checkpoint' "$W/log")"
