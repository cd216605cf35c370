#!/usr/bin/env bash
# The sbatch templates as a user submits them, on a real (local, one-node) Slurm: the one-node
# template with mpirun, the multi-node template with srun --mpi=pmix in topk mode, DZ_CP=2 and
# DZ_TP=2, a resubmission onto a finished output (a no-op), a bad --cp that fails with one error
# line in the job log, and a scaling sweep (sweep.sh) summarised by summarize.py (table and PNG).
source "$(dirname "$0")/lib.sh"
"$DZ" make-model --preset demo --out "$W/m" >/dev/null
"$DZ" make-input --model "$W/m" --docs 24 --min-len 1 --max-len 160 --out "$W/in.h5" >/dev/null
mpirun -np 1 "$DZ" run --model "$W/m" --input "$W/in.h5" --output "$W/ref.h5" 2>/dev/null
mpirun -np 1 "$DZ" run --model "$W/m" --input "$W/in.h5" --output "$W/ref_topk.h5" --mode topk --topk 3 2>/dev/null
export DZ_MODEL=$W/m DZ_INPUT=$W/in.h5

# bodies of the two templates must not drift apart
diff <(sed -n '/^# ---- body/,$p' "$SRC/slurm/dayzero-1node.sbatch") \
     <(sed -n '/^# ---- body/,$p' "$SRC/slurm/dayzero-multinode.sbatch") >/dev/null ||
  fail "the bodies of dayzero-1node.sbatch and dayzero-multinode.sbatch differ"

# 1. one node, 2 ranks, mpirun (the defaults)
j1=$(DZ_OUTPUT=$W/out/one.h5 submit dayzero-1node.sbatch --ntasks-per-node=2 -J one)
# 2. the multi-node template on our one node, srun --mpi=pmix, topk mode with extra flags
j2=$(DZ_OUTPUT=$W/out/two.h5 DZ_LAUNCHER=srun DZ_MODE=topk DZ_EXTRA="--topk 3" \
     submit dayzero-multinode.sbatch --nodes=1 --ntasks-per-node=2 -J two)
say "submitted jobs $j1 (1node, mpirun) and $j2 (multinode, srun --mpi=pmix, topk)"
wait_gone "$j1" 120
wait_gone "$j2" 120
for j in $j1 $j2; do [ "$(job_state "$j")" = COMPLETED ] || fail "job $j ended $(job_state "$j")"; done
same "$W/ref.h5" "$W/out/one.h5" /logprobs /offsets /done
same "$W/ref_topk.h5" "$W/out/two.h5" /topk_ids /topk_logprobs /offsets /done
[ ! -e "$W/out/one.h5.part" ] || fail "a .part is left next to a finished output"
python3 - "$W/out/one.report.json" "$W/out/two.report.json" <<'PY'
import json, sys
for p in sys.argv[1:]:
    r = json.load(open(p))
    assert r["documents"] == 24 and r["world_size"] == 2, (p, r)
print("reports: 24 documents on 2 ranks each")
PY
grep -q "progress: .*documents.*tok/s.*ETA" "$(log_of "$j1")" || fail "no progress line in the job log"
grep -q "srun --mpi=pmix" "$(log_of "$j2")" || fail "job $j2 did not launch with srun --mpi=pmix"
say "both templates ran; outputs equal direct mpirun runs"

# CP and TP from the environment: DZ_CP=2 and DZ_TP=2 on 2 ranks (fp32 sums in another order, so
# equal to the 1-rank run within 1e-4 absolute on log-probs, not bitwise)
jc=$(DZ_OUTPUT=$W/out/cp.h5 DZ_CP=2 submit dayzero-1node.sbatch --ntasks-per-node=2 -J cp2)
jt=$(DZ_OUTPUT=$W/out/tp.h5 DZ_TP=2 DZ_LAUNCHER=srun submit dayzero-multinode.sbatch --nodes=1 --ntasks-per-node=2 -J tp2)
wait_gone "$jc" 120
wait_gone "$jt" 120
for j in $jc $jt; do [ "$(job_state "$j")" = COMPLETED ] || fail "job $j ended $(job_state "$j")"; done
for f in cp tp; do
  h5diff -d 1e-4 "$W/ref.h5" "$W/out/$f.h5" /logprobs /logprobs >/dev/null || fail "DZ_${f^^}=2: /logprobs differ by more than 1e-4"
  same "$W/ref.h5" "$W/out/$f.h5" /offsets /done
done
python3 - "$W/out/cp.report.json" "$W/out/tp.report.json" <<'PY'
import json, sys
c, t = (json.load(open(p)) for p in sys.argv[1:])
assert (c["dp"], c["cp"], c["tp"]) == (1, 2, 1), c
assert (t["dp"], t["cp"], t["tp"]) == (1, 1, 2), t
PY
say "DZ_CP=2 (mpirun) and DZ_TP=2 (srun): reports say dp 1 x cp 2 / tp 2; log-probs within 1e-4"

# 3. resubmitting onto the finished output (what a requeue after the end does): no work, no change
cp "$W/out/one.h5" "$W/one_before.h5"
j3=$(DZ_OUTPUT=$W/out/one.h5 submit dayzero-1node.sbatch --ntasks-per-node=2 -J again)
wait_gone "$j3" 120
[ "$(job_state "$j3")" = COMPLETED ] || fail "resubmission ended $(job_state "$j3")"
cmp -s "$W/one_before.h5" "$W/out/one.h5" || fail "resubmission changed the finished output"
say "resubmission onto a finished output: COMPLETED, file unchanged"

# 4. a configuration error reaches the job log as one line and fails the job
j4=$(DZ_OUTPUT=$W/out/bad.h5 DZ_CP=3 submit dayzero-1node.sbatch --ntasks-per-node=2 -J bad)
wait_gone "$j4" 120
[ "$(job_state "$j4")" = FAILED ] || fail "bad --cp: job ended $(job_state "$j4"), expected FAILED"
n=$(grep -c "^dayzero: error:" "$(log_of "$j4")" || true)
[ "$n" = 1 ] || fail "bad --cp: expected one 'dayzero: error:' line in the log, got $n"
say "bad --cp: FAILED with: $(grep '^dayzero: error:' "$(log_of "$j4")")"

# 5. a scaling sweep (1 and 2 ranks, CP 1 and 2), summarised
bash "$SRC/slurm/sweep.sh" --dry-run --model "$W/m" --input "$W/in.h5" --results "$W/res" \
  --nodes 1,2 --ranks-per-node 1,2 --cp 1,2 --tp 1,2 -- --time=10 >"$W/dry.txt"
[ "$(grep -c '^env .*sbatch' "$W/dry.txt")" = 11 ] || { cat "$W/dry.txt"; fail "dry run: expected 11 sbatch commands (16 points, 5 not divisible)"; }
[ ! -e "$W/res" ] || fail "the dry run created files"
bash "$SRC/slurm/sweep.sh" --model "$W/m" --input "$W/in.h5" --results "$W/res" --nodes 1 \
  --ranks-per-node 1,2 --cp 1,2 --ep 1,2 --wait -- --time=10 >"$W/sweep.txt"
python3 -c "import matplotlib" 2>/dev/null || pip install -q matplotlib >/dev/null 2>&1 || true
python3 "$SRC/slurm/summarize.py" "$W/res" --csv "$W/res/s.csv" | tee "$W/summary.txt"
[ "$(grep -c '^n1_r' "$W/summary.txt")" = 4 ] || fail "summary: expected 4 runs (--ep 2 only where cp 2)"
grep -Eq '^n1_r2_cp2_tp1 +2 +1 +1 +2 +1 +1 ' "$W/summary.txt" || fail "summary: the cp 2 run is not dp 1 x cp 2"
grep -Eq '^n1_r2_cp2_tp1_ep2 +2 +1 +1 +2 +1 +2 ' "$W/summary.txt" || fail "summary: the --ep 2 run (DZ_EP) is not cp 2 x ep 2"
python3 -c "import matplotlib" 2>/dev/null && { [ -s "$W/res/scaling.png" ] || fail "no scaling.png"; }
# without matplotlib: a clear message, the table still printed
python3 -S "$SRC/slurm/summarize.py" "$W/res" --plot "$W/none.png" >"$W/nompl.txt" 2>&1 || true
if ! python3 -S -c "import matplotlib" 2>/dev/null; then
  grep -q "matplotlib is not installed" "$W/nompl.txt" && grep -q '^n1_r2' "$W/nompl.txt" ||
    { cat "$W/nompl.txt"; fail "summarize without matplotlib"; }
fi
say "sweep (4 runs, one with --ep 2) summarised: table, CSV, scaling.png"
say "PASS"
