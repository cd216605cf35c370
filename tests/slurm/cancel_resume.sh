#!/usr/bin/env bash
# Preemption on a real (local) Slurm: a job cancelled mid-run (scancel) keeps its durable documents
# in OUT.h5.part and leaves no OUT.h5; resubmitting the same command continues with --resume and
# gives a file equal to an uninterrupted run. Then the time-limit path: the template's USR1 warning
# (--signal=B:USR1@120, sent here with scancel --signal=USR1 --batch) stops dayzero and requeues
# the job, which resumes by itself and completes equal to an uninterrupted run.
source "$(dirname "$0")/lib.sh"
"$DZ" make-model --preset demo --out "$W/m" 2>/dev/null
# ~45k tokens: several seconds on 2 ranks, long enough to stop in the middle
"$DZ" make-input --model "$W/m" --docs 300 --min-len 50 --max-len 250 --seed 3 --out "$W/in.h5" 2>/dev/null
mpirun -np 2 "$DZ" run --model "$W/m" --input "$W/in.h5" --output "$W/ref.h5" 2>/dev/null
say "uninterrupted reference written"
export DZ_MODEL=$W/m DZ_INPUT=$W/in.h5
N=300

# 1. scancel mid-run, then resubmit
export DZ_OUTPUT=$W/out/a.h5
ja=$(submit dayzero-1node.sbatch --ntasks-per-node=2 -J cancel)
wait_done "$DZ_OUTPUT.part" 5 120
scancel "$ja"
t=$SECONDS
wait_gone "$ja" 90
say "scancel: job $ja left the queue after $((SECONDS - t))s, state $(job_state "$ja")"
[ "$(job_state "$ja")" = CANCELLED ] || fail "cancelled job ended $(job_state "$ja")"
[ ! -e "$DZ_OUTPUT" ] || fail "a cancelled job left a final output"
[ -e "$DZ_OUTPUT.part" ] || fail "no .part after the cancel"
n=$(ndone "$DZ_OUTPUT.part")
say "cancelled with $n/$N durable documents"
[ "$n" -ge 5 ] && [ "$n" -lt $N ] || fail "expected 5 <= done < $N, got $n (job too fast to cancel mid-run?)"
if supports_stop; then
  grep -q "dayzero: stopped by signal 15: .* documents done, .* remaining; rerun with --resume" "$(log_of "$ja")" ||
    fail "no 'stopped by signal' line in the log of the cancelled job"
  say "log: $(grep 'stopped by signal' "$(log_of "$ja")")"
fi
jb=$(submit dayzero-1node.sbatch --ntasks-per-node=2 -J resubmit)
wait_gone "$jb" 180
[ "$(job_state "$jb")" = COMPLETED ] || fail "resubmitted job ended $(job_state "$jb")"
grep -q "resuming $DZ_OUTPUT.part" "$(log_of "$jb")" || fail "resubmitted job did not resume"
same "$W/ref.h5" "$DZ_OUTPUT" /logprobs /offsets /done
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['documents_skipped_done'] >= $n, r['documents_skipped_done']" \
  "$W/out/a.report.json" || fail "resumed run did not skip the $n done documents"
say "resubmitted with --resume: equals the uninterrupted run"

# 2. time-limit warning -> clean stop -> automatic requeue -> resume -> complete
export DZ_OUTPUT=$W/out/b.h5
jc=$(submit dayzero-1node.sbatch --ntasks-per-node=2 -J timelimit)
wait_done "$DZ_OUTPUT.part" 5 120
scancel --signal=USR1 --batch "$jc"
wait_gone "$jc" 180
log=$(log_of "$jc")
grep -q "requeueing job $jc" "$log" || fail "the USR1 warning did not requeue the job"
[ "$(job_state "$jc")" = COMPLETED ] || fail "requeued job ended $(job_state "$jc")"
[ "$(job_field "$jc" Restarts)" -ge 1 ] || fail "job $jc was not restarted"
grep -q "restart 1" "$log" && grep -q "resuming $DZ_OUTPUT.part" "$log" || fail "the restarted job did not resume"
same "$W/ref.h5" "$DZ_OUTPUT" /logprobs /offsets /done
say "time-limit warning: stopped, requeued (Restarts=$(job_field "$jc" Restarts)), resumed, equals the uninterrupted run"
say "PASS"
