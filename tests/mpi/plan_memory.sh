#!/usr/bin/env bash
# `dayzero plan` memory per rank (job/plan_memory.cpp) on the committed DESIGN §7 shapes: weights
# halve under TP 2 except the replicated tensors, state grows with the document, activations with
# the forward's rows, exit code 3 and a clear line when the layout does not fit. (The numbers
# themselves are held to the H200's measurements by `bench e2e`: plan_weight_gib / plan_peak_gib.)
source "$(dirname "$0")/lib.sh"
K=$SRC/configs/bench/kimi_linear_48b_a3b
plan() { "$DZ" plan --model "$K" --cp 1 --json "$@" 2>/dev/null || true; }
plan --length 8192 >"$W/a.json"
plan --length 8192 --tp 2 >"$W/b.json"
plan --length 131072 >"$W/c.json"
plan --length 131072 --max-batch-tokens 16384 >"$W/d.json"
plan --length 8192 --backend cpu >"$W/e.json"
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
m = {k: json.load(open(f"{w}/{k}.json"))["memory"] for k in "abcde"}
a, b, c, d, e = (m[k] for k in "abcde")
# 27 layers, 48B parameters in bf16: ~91.5 GiB (transformers counts 49.1B with embedding + head)
assert 85 < a["weights_gib"] < 95, a
assert a["weights_gib"] / 2 < b["weights_gib"] < 0.52 * a["weights_gib"], (a, b)
assert abs(e["weights_gib"] - 2 * a["weights_gib"]) < 0.01 * a["weights_gib"], e  # fp32 on the CPU
assert c["state_gib"] > 8 * a["state_gib"], (a, c)
# in 16384-token forwards the per-row activations shrink 8x; the explicit MLA's expansion of the
# whole cache ([S, ...] for the last chunk's S = 131072 positions) does not
assert d["detail_gib"]["activations_ffn"] < c["detail_gib"]["activations_ffn"] / 4, (c, d)
assert d["activations_gib"] < c["activations_gib"] / 2, (c, d)
assert a["fits"] and c["fits"], (a, c)
print("plan memory: weights", round(a["weights_gib"], 2), "GiB (TP 2:", round(b["weights_gib"], 2), "), 131072 tokens:",
      round(c["total_gib"], 2), "GiB, in 16384-token forwards:", round(d["total_gib"], 2), "GiB")
PY
set +e
"$DZ" plan --model "$K" --cp 1 --length 8192 --device-gib 40 >"$W/out.txt" 2>&1
rc=$?
set -e
[[ $rc == 3 ]] || { cat "$W/out.txt"; echo "FAIL: plan exit $rc for a layout that does not fit (expected 3)"; exit 1; }
grep -q "DOES NOT FIT" "$W/out.txt" || { cat "$W/out.txt"; echo "FAIL: no clear line"; exit 1; }
# Expert parallelism: --ep 2 over a TP group of 2 holds the same expert bytes as width sharding
# (half of every expert vs half of the experts); --cp 4 --tp 2 --ep 8 a quarter of that, with the
# rest of the weights unchanged; an --ep the layout cannot hold is refused.
for a in "tp2:--tp 2" "ep2:--tp 2 --ep 2" "ep8:--tp 2 --ep 8"; do
  "$DZ" plan --model "$K" --cp 4 --length 8192 ${a#*:} --json >"$W/${a%%:*}.json"
done
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
m = {k: json.load(open(f"{w}/{k}.json"))["memory"]["detail_gib"] for k in ("tp2", "ep2", "ep8")}
e = {k: v["weights_experts"] for k, v in m.items()}
assert abs(e["ep2"] - e["tp2"]) <= 1e-9 * e["tp2"] and abs(e["ep8"] - e["tp2"] / 4) <= 1e-9 * e["tp2"], e
assert abs(m["ep8"]["weights_other"] - m["tp2"]["weights_other"]) <= 1e-9 * m["tp2"]["weights_other"], m
print("plan --ep: routed experts", round(e["tp2"], 2), "GiB a rank at --tp 2 (and --ep 2),", round(e["ep8"], 2), "at --ep 8")
PY
if "$DZ" plan --model "$K" --cp 4 --length 8192 --tp 2 --ep 3 >"$W/bad.txt" 2>&1; then
  echo "FAIL: plan accepted --tp 2 --ep 3"; exit 1
fi
grep -q "must be --tp (2) times a divisor of --cp (4)" "$W/bad.txt" || { cat "$W/bad.txt"; echo "FAIL: unclear --ep refusal"; exit 1; }
say "plan memory invariants hold; a layout over the device's memory exits 3; --ep splits the routed experts"
