#!/usr/bin/env bash
# scripts/bench-scaling-gpu.sh (issue 14's scaling runs on a multi-GPU node) in its smoke mode: the
# same runs, reports, per-part tables and target rows on 4 CPU ranks with the demo preset, so the
# one device command it is written for does not fail on its plumbing. Its numbers mean nothing here.
source "$(dirname "$0")/lib.sh"
DZ_SCALING_SMOKE=1 DZ_GPUS=4 DZ_COMMIT=smoke bash "$SRC/scripts/bench-scaling-gpu.sh" - "$(dirname "$DZ")" "$W/res" \
  >"$W/out.txt" 2>&1 || { cat "$W/out.txt"; exit 1; }
grep -q FAILED "$W/out.txt" && { cat "$W/out.txt"; exit 1; }
# every run's report, every part's CSV, the manifest and the targets table
for f in cp/demo_T512_cp1 cp/demo_T512_cp2 cp/demo_T512_cp4 dp/demo_docs16x64_dp1 dp/demo_docs16x64_dp2 \
         dp/demo_docs16x64_dp4 tp/demo_docs2x256_tp1 tp/demo_docs2x256_tp2 ep/demo_tp2 ep/demo_tp2_ep2 ep/demo_cp2 \
         ep/demo_cp2_ep2; do
  [[ -s $W/res/$f.json ]] || { say "missing report $f.json"; cat "$W/out.txt"; exit 1; }
done
for p in cp dp tp ep; do [[ -s $W/res/$p/scaling.csv ]] || { say "missing $p/scaling.csv"; exit 1; }; done
python3 - "$W/res" <<'PY'
import json, sys
res = sys.argv[1]
man = json.load(open(f"{res}/manifest.json"))
assert man["commit"] == "smoke" and man["smoke"] and man["gpus"] == 4, man
rows = [l for l in open(f"{res}/targets.md") if l.startswith("| ") and not l.startswith("| part")]
parts = [l.split("|")[1].strip() for l in rows]
# cp: 3 rows with the 1.8x / 3.4x targets; dp: 3 with 0.95; tp: 2; ep: 2 pairs
assert parts.count("cp") == 3 and parts.count("dp") == 3 and parts.count("tp") == 2 and parts.count("ep") == 2, parts
assert any(">= 1.8x" in l for l in rows) and any(">= 3.4x" in l for l in rows) and any(">= 0.95" in l for l in rows)
# the same numbers as the reports: DP = 2's efficiency from its two reports
r1, r2 = (json.load(open(f"{res}/dp/demo_docs16x64_dp{n}.json"))["tokens_per_s"] for n in (1, 2))
assert any(f"{r2 / (2 * r1):.3f}" in l for l in rows if "_dp2" in l), (r1, r2, rows)
print("[scaling_smoke] 12 runs, 4 tables, the targets table consistent with the reports")
PY
