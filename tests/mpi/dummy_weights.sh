#!/usr/bin/env bash
# --dummy-weights: a model directory holding only config.json runs the whole job with
# deterministic random weights. Checked: finite log-probs of the right count, bitwise the same on a
# second run, the same weights in every TP layout (TP slices of the same generated tensors: within
# 1e-4, the CP x TP equality test's tolerance, for its reason: fp32 partial sums regrouped); without
# the flag the directory is refused with a clear error; `bench e2e` runs the same path on the CPU
# and reports its timings as JSON.
source "$(dirname "$0")/lib.sh"
"$DZ" make-model --preset demo --out "$W/full" >/dev/null
mkdir -p "$W/cfg" && cp "$W/full/config.json" "$W/cfg/"
edge_tokens 256 "$W/t.txt" 4
"$DZ" make-input --tokens-file "$W/t.txt" --out "$W/in.h5" >/dev/null
mpi 1 run --model "$W/cfg" --dummy-weights --input "$W/in.h5" --output "$W/a.h5" 2>"$W/log"
grep -q "dummy weights from" "$W/log" || { cat "$W/log"; echo "FAIL: no dummy-weights line"; exit 1; }
mpi 1 run --model "$W/cfg" --dummy-weights --input "$W/in.h5" --output "$W/b.h5" 2>/dev/null
same "$W/a.h5" "$W/b.h5" /logprobs /offsets
python3 - "$W/a.h5" "$SRC/tests/mpi" <<'PY'
import math, sys
sys.path.insert(0, sys.argv[2])
from logprob_stats import values
v = values(sys.argv[1], "/logprobs")
lens = [1, 2, 3, 7, 64, 65, 130]
assert len(v) >= sum(L - 1 for L in lens), len(v)
assert all(math.isfinite(x) and x <= 0 for x in v), "non-finite or positive log-prob"
assert max(v) - min(v) > 1e-3, "log-probs all equal: weights are not random"
PY
mpi 2 run --model "$W/cfg" --dummy-weights --tp 2 --input "$W/in.h5" --output "$W/tp2.h5" 2>/dev/null
d=$(python3 "$SRC/tests/mpi/maxdiff.py" "$W/a.h5" "$W/tp2.h5" /logprobs)
python3 -c "import sys; sys.exit(0 if float('$d') <= 1e-4 else 1)" || { echo "FAIL: --tp 2 differs by $d"; exit 1; }
# The real checkpoint's weights differ from the dummy ones (the flag is not ignored).
mpi 1 run --model "$W/full" --input "$W/in.h5" --output "$W/real.h5" 2>/dev/null
if h5diff -q "$W/a.h5" "$W/real.h5" /logprobs /logprobs; then echo "FAIL: dummy = real weights"; exit 1; fi
if mpi 1 run --model "$W/cfg" --input "$W/in.h5" --output "$W/c.h5" 2>"$W/err"; then
  echo "FAIL: a directory without weights ran without --dummy-weights"; exit 1
fi
grep -q "model.safetensors" "$W/err" || { cat "$W/err"; echo "FAIL: unclear error without weights"; exit 1; }
"$DZ" bench e2e --model "$W/cfg" --backend cpu --tokens 40 --repeats 1 --json "$W/bench.json" >/dev/null 2>&1
python3 - "$W/bench.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
r = j["results"]
assert [x["mode"] for x in r] == ["last-logits", "logprobs"], r
for x in r:
    assert "error" not in x and x["ms"] > 0 and x["T"] == 40 and x["params"] > 0, x
    assert 0 < x["active_nonembed"] < x["params"], x
PY
# --batch: three documents per packed forward, generate mode decoding them together
"$DZ" bench e2e --model "$W/cfg" --backend cpu --tokens 40 --repeats 1 --batch 3 --modes generate,logprobs \
  --new-tokens 4 --json "$W/bench3.json" >/dev/null 2>&1
python3 - "$W/bench3.json" "$W/bench.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"]
one = {x["mode"]: x for x in json.load(open(sys.argv[2]))["results"]}
assert [x["mode"] for x in r] == ["generate", "logprobs"], r
for x in r:
    assert "error" not in x and x["batch"] == 3 and x["ms"] > 0, x
g = r[0]
assert g["new_tokens"] == 4 and g["decode_ms_per_token"] > 0 and abs(g["decode_tok_s"] - 3e3 / g["decode_ms_per_token"]) < 1e-6 * g["decode_tok_s"], g
lp = r[1]
assert abs(lp["tok_s"] - 120 / lp["ms"] * 1e3) < 1e-6 * lp["tok_s"], lp  # 3 x 40 tokens per call
PY
say "dummy weights: deterministic, TP 2 within $d, refused without the flag, bench e2e (one and three documents) ok"
