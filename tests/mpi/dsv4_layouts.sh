#!/usr/bin/env bash
# DeepSeek-V4 (the deepseek_v4 golden) under the layouts it supports: --tp 2 and --tp 4 (the
# attention replicated, the experts width-sharded: within 1e-4 of one rank, the CP x TP test's
# tolerance, for the experts' fp32 partial sums) and two DP ranks and all documents packed in one
# forward (identical); --cp 2 is refused before any work, naming the option, with no output file.
source "$(dirname "$0")/lib.sh"
M=$SRC/tests/golden/deepseek_v4
cp "$M/golden.h5" "$W/in.h5"
mpi 1 run --model "$M" --input "$W/in.h5" --output "$W/one.h5" 2>/dev/null
for lay in "2 --tp 2" "4 --tp 4" "2 " "1 --max-batch-tokens 100000"; do
  read -r np opts <<<"$lay"
  # shellcheck disable=SC2086  # $opts is a list of options
  mpi "$np" run --model "$M" --input "$W/in.h5" --output "$W/lay.h5" --overwrite $opts 2>/dev/null
  d=$(python3 "$SRC/tests/mpi/maxdiff.py" "$W/one.h5" "$W/lay.h5" /logprobs)
  python3 -c "import sys; sys.exit(0 if float('$d') <= 1e-4 else 1)" || { echo "FAIL: -np $np $opts: max |logprob diff| $d"; exit 1; }
  say "-np $np ${opts:-(dp 2)}: max |logprob diff| $d vs one rank"
done
if mpi 2 run --model "$M" --input "$W/in.h5" --output "$W/cp.h5" --cp 2 >"$W/cp.log" 2>&1; then
  echo "FAIL: --cp 2 ran"; exit 1
fi
grep -q -- "--cp 2: DeepSeek-V4" "$W/cp.log" || { cat "$W/cp.log"; echo "FAIL: --cp 2 refused without naming it"; exit 1; }
[[ ! -e $W/cp.h5 && ! -e $W/cp.h5.part ]] || { echo "FAIL: --cp 2 left an output file"; exit 1; }
say "--cp 2 refused: $(grep -m1 -o -- '--cp 2: DeepSeek-V4[^;]*' "$W/cp.log")"
