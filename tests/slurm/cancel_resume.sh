#!/usr/bin/env bash
# Preemption on a real (local) Slurm: a job cancelled mid-run (scancel; with mpirun, then with srun
# --mpi=pmix) keeps its durable documents in OUT.h5.part and leaves no OUT.h5; resubmitting the
# same command continues with --resume and gives a file equal to an uninterrupted run. Then the time-limit path: the template's USR1 warning
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

# 1. scancel mid-run (mpirun), again after more progress (srun --mpi=pmix), then resubmit
export DZ_OUTPUT=$W/out/a.h5
ja=$(submit dayzero-1node.sbatch --ntasks-per-node=2 -J cancel)
wait_done "$DZ_OUTPUT.part" 5 120
scancel "$ja"
t=$SECONDS
wait_gone "$ja" 90
say "scancel (mpirun): job $ja left the queue after $((SECONDS - t))s, state $(job_state "$ja")"
[ "$(job_state "$ja")" = CANCELLED ] || fail "cancelled job ended $(job_state "$ja")"
[ ! -e "$DZ_OUTPUT" ] || fail "a cancelled job left a final output"
[ -e "$DZ_OUTPUT.part" ] || fail "no .part after the cancel"
n=$(ndone "$DZ_OUTPUT.part")
[ "$n" -ge 5 ] && [ "$n" -lt $N ] || fail "expected 5 <= done < $N, got $n (job too fast to cancel mid-run?)"
# mpirun, signalled by Slurm too, may drop the ranks' last lines: the template's own line says it
grep -q "stopped (rc [0-9]*): $n of $N documents durable in $DZ_OUTPUT.part" "$(log_of "$ja")" ||
  fail "the log of the cancelled job does not say '$n of $N documents durable'"
say "  cancelled with $n/$N durable documents; the log says so"

js=$(DZ_LAUNCHER=srun submit dayzero-1node.sbatch --ntasks-per-node=2 -J cancel_srun)
wait_done "$DZ_OUTPUT.part" $((n + 5)) 120
scancel "$js"
wait_gone "$js" 90
[ "$(job_state "$js")" = CANCELLED ] || fail "cancelled srun job ended $(job_state "$js")"
[ ! -e "$DZ_OUTPUT" ] || fail "a cancelled job left a final output"
n2=$(ndone "$DZ_OUTPUT.part")
[ "$n2" -ge $((n + 5)) ] && [ "$n2" -lt $N ] || fail "expected $((n + 5)) <= done < $N after the second cancel, got $n2"
grep -q "resuming $DZ_OUTPUT.part" "$(log_of "$js")" || fail "the srun job did not resume"
if supports_stop; then
  line=$(grep "^dayzero: stopped by signal 15: [0-9]* documents [a-z ]*, [0-9]* remaining; rerun with --resume" "$(log_of "$js")" || true)
  [ -n "$line" ] || fail "no 'dayzero: stopped by signal 15' line in the log of the cancelled srun job"
  grep -q "stopped (rc 143): $n2 of $N documents durable" "$(log_of "$js")" || fail "srun job: expected rc 143 and $n2 durable"
  say "  srun job: $line"
fi
say "scancel (srun --mpi=pmix): $n2/$N durable documents"

jb=$(submit dayzero-1node.sbatch --ntasks-per-node=2 -J resubmit)
wait_gone "$jb" 180
[ "$(job_state "$jb")" = COMPLETED ] || fail "resubmitted job ended $(job_state "$jb")"
grep -q "resuming $DZ_OUTPUT.part" "$(log_of "$jb")" || fail "resubmitted job did not resume"
same "$W/ref.h5" "$DZ_OUTPUT" /logprobs /offsets /done
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['documents_skipped_done'] == $n2, r['documents_skipped_done']" \
  "$W/out/a.report.json" || fail "resumed run did not skip exactly the $n2 done documents"
say "resubmitted with --resume: equals the uninterrupted run"

# 2. time-limit warning -> clean stop -> automatic requeue -> resume -> complete
export DZ_OUTPUT=$W/out/b.h5
jc=$(submit dayzero-1node.sbatch --ntasks-per-node=2 -J timelimit)
wait_done "$DZ_OUTPUT.part" 5 120
scancel --signal=USR1 --batch "$jc"
wait_gone "$jc" 180
log=$(log_of "$jc")
grep -q "requeueing job $jc" "$log" || fail "the USR1 warning did not requeue the job"
if supports_stop; then  # here only the ranks get SIGTERM, so their stop line reaches the log
  grep -q "^dayzero: stopped by signal 15: " "$log" || fail "no 'dayzero: stopped by signal 15' line after the USR1 warning"
  grep -q "stopped before the time limit (rc 143)" "$log" || fail "expected rc 143 after the USR1 warning"
fi
[ "$(job_state "$jc")" = COMPLETED ] || fail "requeued job ended $(job_state "$jc")"
[ "$(job_field "$jc" Restarts)" -ge 1 ] || fail "job $jc was not restarted"
grep -q "restart 1" "$log" && grep -q "resuming $DZ_OUTPUT.part" "$log" || fail "the restarted job did not resume"
same "$W/ref.h5" "$DZ_OUTPUT" /logprobs /offsets /done
say "time-limit warning: stopped, requeued (Restarts=$(job_field "$jc" Restarts)), resumed, equals the uninterrupted run"
say "PASS"
