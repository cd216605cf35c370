#!/usr/bin/env bash
# The low-precision options on the CPU backend (DESIGN §5, emulated bit-exactly as the CUDA kernels
# quantize): --kv-cache fp8 (MLA latent per 128-tile FP8 E4M3 + fp32 scale, RoPE part BF16) and
# --index-quant mxfp8 (DSA indexer queries and keys). Prints their log-prob cost against the
# unquantized run for the demo preset and the golden models, checks that each option takes effect,
# that the cost on the demo preset (initialised at the usual 0.02 scale) is small, and that a
# quantized CP x TP run equals the quantized single-rank run.
source "$(dirname "$0")/lib.sh"
"$DZ" make-model --preset demo --out "$W/demo" >/dev/null
python3 - "$W/t.txt" <<'PY'
import random, sys
r = random.Random(4)
open(sys.argv[1], "w").write("\n".join(" ".join(str(r.randrange(3, 256)) for _ in range(L))
                                        for L in [1, 2, 7, 33, 65, 130, 200, 300]) + "\n")
PY
"$DZ" make-input --tokens-file "$W/t.txt" --out "$W/in.h5" >/dev/null
printf '%-14s %-26s %12s %12s %12s\n' model option "mean|dlp|" "median|dlp|" "max|dlp|"
for m in "$W/demo" "$SRC/tests/golden/deepseek_v32" "$SRC/tests/golden/kimi_linear"; do
  name=$(basename "$m")
  mpi 1 run --model "$m" --input "$W/in.h5" --output "$W/${name}_ref.h5" 2>/dev/null
  for opt in "--kv-cache fp8" "--index-quant mxfp8" "--kv-cache fp8 --index-quant mxfp8"; do
    [ "$name" = kimi_linear ] && [[ $opt == *mxfp8* ]] && continue  # no indexer in kimi_linear
    tag="${name}_$(echo $opt | tr -d ' -')"
    mpi 1 run --model "$m" --input "$W/in.h5" --output "$W/$tag.h5" $opt 2>/dev/null
    read -r mean med mx <<<"$(python3 "$SRC/tests/mpi/logprob_stats.py" "$W/${name}_ref.h5" "$W/$tag.h5")"
    printf '%-14s %-26s %12s %12s %12s\n' "$name" "$opt" "$mean" "$med" "$mx"
    python3 -c "import sys; sys.exit(0 if float('$mx') > 0 else 1)" || { echo "FAIL: $opt had no effect on $name"; exit 1; }
    if [ "$name" = demo ]; then
      python3 -c "import sys; sys.exit(0 if float('$mean') < 1e-3 else 1)" ||
        { echo "FAIL: $opt costs $mean nats on average on the demo preset"; exit 1; }
    fi
  done
done
# quantized CP x TP == quantized single rank (quantization is per token: layout-independent)
for m in "$W/demo" "$SRC/tests/golden/deepseek_v32"; do
  name=$(basename "$m")
  q=(--kv-cache fp8 --index-quant mxfp8)
  mpi 4 run --model "$m" --input "$W/in.h5" --output "$W/${name}_q_cp2tp2.h5" "${q[@]}" --cp 2 --tp 2 2>/dev/null
  if ! h5diff -d 1e-4 "$W/${name}_kvcachefp8indexquantmxfp8.h5" "$W/${name}_q_cp2tp2.h5" /logprobs /logprobs >/dev/null; then
    echo "FAIL: quantized CP2 x TP2 differs from the quantized single rank on $name"; exit 1
  fi
done
say "each option takes effect, costs < 1e-3 nats on the demo preset, and is layout-independent"
