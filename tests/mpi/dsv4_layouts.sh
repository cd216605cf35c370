#!/usr/bin/env bash
# DeepSeek-V4 (the deepseek_v4 golden) under its layouts: --tp 2 and --tp 4 (the attention
# replicated, the experts width-sharded), --cp 2 and --cp 4 (each rank projects its rows, the
# kv rows and compressor projections gathered so every rank pools the same entries) and --cp 2
# --tp 2: within 1e-4 of one rank, the CP x TP test's tolerance (the experts' fp32 partial sums);
# two DP ranks and all documents packed in one forward; the golden's documents reach 130 tokens,
# past its HCA windows of 16 and CSA windows of 4 (tests/mpi/cp_tp_equal.sh runs it too).
source "$(dirname "$0")/lib.sh"
M=$SRC/tests/golden/deepseek_v4
cp "$M/golden.h5" "$W/in.h5"
mpi 1 run --model "$M" --input "$W/in.h5" --output "$W/one.h5" 2>/dev/null
for lay in "2 --tp 2" "4 --tp 4" "2 --cp 2" "4 --cp 4" "4 --cp 2 --tp 2" "2 " "1 --max-batch-tokens 100000"; do
  read -r np opts <<<"$lay"
  # shellcheck disable=SC2086  # $opts is a list of options
  mpi "$np" run --model "$M" --input "$W/in.h5" --output "$W/lay.h5" --overwrite $opts 2>/dev/null
  d=$(python3 "$SRC/tests/mpi/maxdiff.py" "$W/one.h5" "$W/lay.h5" /logprobs)
  python3 -c "import sys; sys.exit(0 if float('$d') <= 1e-4 else 1)" || { echo "FAIL: -np $np $opts: max |logprob diff| $d"; exit 1; }
  say "-np $np ${opts:-(dp 2)}: max |logprob diff| $d vs one rank"
done
