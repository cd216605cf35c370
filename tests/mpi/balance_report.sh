#!/usr/bin/env bash
# The report's per-rank work: a CP=4 run of one document counts, on each rank, exactly the
# indexer / attention / linear-attention FLOPs the work model predicts for its zigzag segments
# (`dayzero plan`), and records the wall time of each stage. Printed beside a contiguous split.
source "$(dirname "$0")/lib.sh"
"$DZ" make-model --preset demo --out "$W/m" >/dev/null
python3 -c "
import random; r = random.Random(3)
open('$W/t.txt', 'w').write(' '.join(str(r.randrange(512)) for _ in range(1500)) + '\n')"
"$DZ" make-input --tokens-file "$W/t.txt" --out "$W/in.h5" >/dev/null
mpi 4 run --model "$W/m" --input "$W/in.h5" --output "$W/o.h5" --cp 4 --report "$W/r.json" 2>/dev/null
"$DZ" plan --model "$W/m" --length 1500 --cp 4 --json >"$W/plan.json"
"$DZ" plan --model "$W/m" --length 1500 --cp 4
python3 - "$W/r.json" "$W/plan.json" <<'PY'
import json, sys
rep, plan = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
pred = {r["rank"]: r["flops"] for r in plan["zigzag"]["per_rank"]}
print(f"{'rank':>4} {'cp':>3} {'indexer':>14} {'attention':>14} {'linear_attn':>14}  stage seconds")
for r in sorted(rep["per_rank"], key=lambda r: r["rank"]):
    f = r["flops"]
    print(f"{r['rank']:>4} {r['cp']:>3} {f.get('indexer', 0):>14.6g} {f.get('attention', 0):>14.6g} "
          f"{f.get('linear_attention', 0):>14.6g}  " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["seconds"].items())))
    for k in ("indexer", "attention", "linear_attention"):
        want, got = pred[r["cp"]][k], f.get(k, 0.0)
        assert abs(got - want) <= 1e-9 * max(1.0, want), (r["rank"], k, got, want)
    for stage in ("la_stage1", "la_merge", "la_stage2", "kv_gather", "indexer", "attention"):
        assert stage in r["seconds"], (r["rank"], stage, r["seconds"])
print("per-rank FLOPs equal the work model; zigzag max/mean", round(plan["zigzag"]["max_over_mean"], 4),
      "vs contiguous", round(plan["contiguous"]["max_over_mean"], 4))
PY
say "report per-rank work matches the zigzag work model"
# DeepSeek-V4 (its golden, one 300-token document: past its CSA and HCA windows): the window rows
# plus selected (CSA) or closed (HCA) entries of its queries, and the CSA indexer over the closed
# entries, per rank as the work model counts them.
python3 -c "
import random; r = random.Random(4)
open('$W/t4.txt', 'w').write(' '.join(str(r.randrange(3, 256)) for _ in range(300)) + '\n')"
"$DZ" make-input --tokens-file "$W/t4.txt" --out "$W/in4.h5" >/dev/null
mpi 4 run --model "$SRC/tests/golden/deepseek_v4" --input "$W/in4.h5" --output "$W/o4.h5" --cp 4 --report "$W/r4.json" 2>/dev/null
"$DZ" plan --model "$SRC/tests/golden/deepseek_v4" --length 300 --cp 4 --json >"$W/plan4.json"
python3 - "$W/r4.json" "$W/plan4.json" <<'PY'
import json, sys
rep, plan = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
pred = {r["rank"]: r["flops"] for r in plan["zigzag"]["per_rank"]}
for r in sorted(rep["per_rank"], key=lambda r: r["rank"]):
    for k in ("indexer", "attention"):
        want, got = pred[r["cp"]][k], r["flops"].get(k, 0.0)
        assert want > 0 and abs(got - want) <= 1e-9 * max(1.0, want), (r["rank"], k, got, want)
print("deepseek_v4 --cp 4: per-rank indexer and attention FLOPs equal the work model; zigzag max/mean",
      round(plan["zigzag"]["max_over_mean"], 4))
PY
