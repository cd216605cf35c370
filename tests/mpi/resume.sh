#!/usr/bin/env bash
# A run killed mid-way (SIGKILL of the writer rank after a few documents) leaves no OUT, a
# resumable OUT.part with those documents done; --resume completes it, and the result equals an
# uninterrupted run. Every run on DZ_TEST_BACKEND (default cpu).
source "$(dirname "$0")/lib.sh"
"$DZ" make-model --preset demo --out "$W/m"
edge_tokens 512 "$W/t.txt" 20
"$DZ" make-input --tokens-file "$W/t.txt" --out "$W/in.h5"
for mode in logprobs generate; do
  args=(--model "$W/m" --input "$W/in.h5" --mode $mode --max-new-tokens 5 "${BACKEND[@]}")
  mpi 2 run "${args[@]}" --output "$W/full_$mode.h5"
  set +e
  DAYZERO_FAULT_KILL_AFTER_DOCS=6 mpi 2 run "${args[@]}" --output "$W/cut_$mode.h5" 2>"$W/err.txt"
  rc=$?
  set -e
  [ $rc -ne 0 ] || { echo "FAIL: killed run exited 0"; exit 1; }
  [ ! -e "$W/cut_$mode.h5" ] || { echo "FAIL: killed run left a final output"; exit 1; }
  [ -e "$W/cut_$mode.h5.part" ] || { echo "FAIL: no .part after the kill"; exit 1; }
  ndone=$(ndone "$W/cut_$mode.h5.part")
  say "$mode: killed after $ndone durable documents (rc=$rc)"
  [ "$ndone" -ge 6 ] || { echo "FAIL: expected >= 6 done documents, got $ndone"; exit 1; }
  # without --resume the interrupted run is protected
  set +e
  mpi 1 run "${args[@]}" --output "$W/cut_$mode.h5" 2>"$W/err2.txt"; rc=$?
  set -e
  [ $rc -ne 0 ] && grep -q "resume" "$W/err2.txt" || { echo "FAIL: rerun without --resume not refused"; cat "$W/err2.txt"; exit 1; }
  mpi 3 run "${args[@]}" --output "$W/cut_$mode.h5" --resume --report "$W/rep.json"
  python3 -c "import json,sys; r=json.load(open('$W/rep.json')); assert r['documents_skipped_done'] >= 6, r; print('skipped', r['documents_skipped_done'])"
  if [ $mode = logprobs ]; then
    same "$W/full_$mode.h5" "$W/cut_$mode.h5" /logprobs /offsets /done
  else
    same "$W/full_$mode.h5" "$W/cut_$mode.h5" /generated /generated_offsets /done
  fi
done
say "killed + resumed runs equal uninterrupted runs"
