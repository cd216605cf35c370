#!/usr/bin/env bash
# --max-batch-tokens N packs consecutive short documents into one forward (Model::forward_packed:
# per-row work over all of them, each token mixer per document). Every mode must equal the run with
# one document per forward, on every family (demo preset: KDA + MLA/DSA + MoE + AttnRes; the three
# goldens), under DP (batches dealt to 3 ranks) and TP 2. Bitwise on the CPU backend: the packed
# rows go through the same per-row arithmetic (checked; the GPU test allows bf16 GEMM tiling). In
# generate mode the documents of a packed forward also decode together, one row each per step.
source "$(dirname "$0")/lib.sh"
"$DZ" make-model --preset demo --out "$W/demo" >/dev/null
for m in "$W/demo" "$SRC/tests/golden/qwen3_next" "$SRC/tests/golden/kimi_linear" "$SRC/tests/golden/deepseek_v32" \
         "$SRC/tests/golden/kimi_k3"; do
  name=$(basename "$m")
  edge_tokens 256 "$W/t.txt" 8
  "$DZ" make-input --tokens-file "$W/t.txt" --out "$W/in.h5" --overwrite >/dev/null
  for mode in logprobs topk last-logits generate; do
    mpi 1 run --model "$m" --input "$W/in.h5" --output "$W/${name}_$mode.h5" --mode "$mode" --topk 3 \
      --max-new-tokens 4 2>/dev/null
    mpi 1 run --model "$m" --input "$W/in.h5" --output "$W/${name}_${mode}_p.h5" --mode "$mode" --topk 3 \
      --max-new-tokens 4 --max-batch-tokens 300 2>"$W/log"
    grep -q "forwards of at most 300 tokens" "$W/log" || { cat "$W/log"; echo "FAIL: $name: nothing packed"; exit 1; }
  done
  same "$W/${name}_logprobs.h5" "$W/${name}_logprobs_p.h5" /logprobs /offsets
  same "$W/${name}_topk.h5" "$W/${name}_topk_p.h5" /topk_ids /topk_logprobs
  same "$W/${name}_last-logits.h5" "$W/${name}_last-logits_p.h5" /last_logits
  same "$W/${name}_generate.h5" "$W/${name}_generate_p.h5" /generated /generated_offsets
  say "$name: packed forwards equal one document per forward in every mode"
done
# Batched decode (the documents of a packed forward decode together): sampled generation too.
edge_tokens 256 "$W/t.txt" 8
"$DZ" make-input --tokens-file "$W/t.txt" --out "$W/in.h5" --overwrite >/dev/null
for mbt in 0 400; do
  mpi 1 run --model "$W/demo" --input "$W/in.h5" --output "$W/gen$mbt.h5" --mode generate --max-new-tokens 12 \
    --temperature 0.8 --seed 3 --max-batch-tokens $mbt 2>/dev/null
done
same "$W/gen0.h5" "$W/gen400.h5" /generated /generated_offsets
say "sampled generation, 12 tokens: batched decode equals one document at a time"
# DP 3 (batches dealt through the shared counter) and TP 2 on the demo preset.
"$DZ" make-input --model "$W/demo" --docs 40 --min-len 1 --max-len 120 --out "$W/in.h5" --overwrite >/dev/null
mpi 1 run --model "$W/demo" --input "$W/in.h5" --output "$W/one.h5" 2>/dev/null
mpi 3 run --model "$W/demo" --input "$W/in.h5" --output "$W/dp3.h5" --max-batch-tokens 256 2>/dev/null
same "$W/one.h5" "$W/dp3.h5" /logprobs /offsets /done
mpi 2 run --model "$W/demo" --input "$W/in.h5" --output "$W/tp2.h5" --tp 2 2>/dev/null
mpi 2 run --model "$W/demo" --input "$W/in.h5" --output "$W/tp2p.h5" --tp 2 --max-batch-tokens 256 2>/dev/null
same "$W/tp2.h5" "$W/tp2p.h5" /logprobs /offsets
say "DP 3 and TP 2 with packing equal their unpacked runs"
