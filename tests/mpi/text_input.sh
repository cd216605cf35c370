#!/usr/bin/env bash
# Text in (issue 15): make-input --text DIR|FILE.jsonl|FILE --tokenizer MODEL_DIR tokenizes with the
# checkpoint's tokenizer.json (scripts/dz_tokenize.py, HF tokenizers). The ids equal what
# `tokenizers` gives for the committed tokenizer (tests/fixtures/tokenizer, a byte-level BPE of 400
# ids) document by document, in the documented order (files sorted by relative path; .jsonl lines in
# order, ids from the "id" field or the line number); /doc_ids, /bytes (UTF-8) and the tokenizer's
# sha256 are in the input; --add-special-tokens adds the tokenizer's BOS. Then from the text to a
# perplexity: the demo model scores it and `summarize` reports bits per byte. Refused: an empty
# document, a .jsonl line that is not JSON, a missing tokenizer, ids beyond the model's vocabulary.
source "$(dirname "$0")/lib.sh"
TOK=$SRC/tests/fixtures/tokenizer
"$DZ" make-model --preset demo --out "$W/demo" >/dev/null
mkdir -p "$W/txt/sub"
printf 'Perplexity is the exponential of the mean negative log-likelihood.\n' > "$W/txt/b.txt"
printf 'Straße, Übergrößen und 日本語のテキスト: bytes matter.\n\nA second paragraph.' > "$W/txt/a.txt"
printf 'def f(x): return x * 2  # code\n' > "$W/txt/sub/c.txt"
printf 'not a text file' > "$W/txt/skip.md"
python3 - "$W" <<'PY'
import json, sys
W = sys.argv[1]
with open(f"{W}/docs.jsonl", "w") as f:
    f.write(json.dumps({"id": "first", "text": "A context, then a continuation."}) + "\n")
    f.write("\n")  # blank lines are skipped
    f.write(json.dumps({"text": "no id: the line number"}) + "\n")
    f.write(json.dumps({"id": 7, "text": "numeric ids become strings: 3.14159"}) + "\n")
with open(f"{W}/body.jsonl", "w") as f:
    f.write(json.dumps({"name": "x", "body": "another key"}) + "\n")
PY
"$DZ" make-input --text "$W/txt" --tokenizer "$TOK" --model "$W/demo" --out "$W/dir.h5" >/dev/null
"$DZ" make-input --text "$W/docs.jsonl" --tokenizer "$TOK" --out "$W/jsonl.h5" >/dev/null
"$DZ" make-input --text "$W/docs.jsonl" --tokenizer "$TOK/tokenizer.json" --add-special-tokens --out "$W/bos.h5" >/dev/null
"$DZ" make-input --text "$W/body.jsonl" --tokenizer "$TOK" --text-key body --id-key name --out "$W/body.h5" >/dev/null
"$DZ" make-input --text "$W/txt/b.txt" --tokenizer "$TOK" --out "$W/one.h5" >/dev/null
python3 - "$W" "$TOK/tokenizer.json" <<'PY'
import hashlib, json, os, sys, h5py
from tokenizers import Tokenizer
W, tj = sys.argv[1:]
tok = Tokenizer.from_file(tj)
sha = hashlib.sha256(open(tj, "rb").read()).hexdigest()
def check(h5, docs, special=False):
    f = h5py.File(h5, "r")
    t, o = f["tokens"][:], f["offsets"][:]
    ids = [x.decode() for x in f["doc_ids"][:]]
    assert ids == [d[0] for d in docs], (h5, ids)
    for i, (_, text) in enumerate(docs):
        want = tok.encode(text, add_special_tokens=special).ids
        assert list(t[o[i]:o[i + 1]]) == want, (h5, i, list(t[o[i]:o[i + 1]]), want)
        assert f["bytes"][i] == len(text.encode("utf-8")), (h5, i)
    assert f.attrs["tokenizer_sha256"] == sha and f.attrs["tokenizer"] == os.path.abspath(tj), dict(f.attrs)
    assert f.attrs["tokenizer_add_special_tokens"] == ("true" if special else "false")
rd = lambda p: open(f"{W}/txt/{p}", encoding="utf-8").read()
check(f"{W}/dir.h5", [(p, rd(p)) for p in ("a.txt", "b.txt", os.path.join("sub", "c.txt"))])
lines = [json.loads(l) for l in open(f"{W}/docs.jsonl") if l.strip()]
docs = [("first", lines[0]["text"]), ("3", lines[1]["text"]), ("7", lines[2]["text"])]
check(f"{W}/jsonl.h5", docs)
check(f"{W}/bos.h5", docs, special=True)
assert h5py.File(f"{W}/bos.h5", "r")["tokens"][0] == tok.token_to_id("<s>")
check(f"{W}/body.h5", [("x", "another key")])
check(f"{W}/one.h5", [("b.txt", rd("b.txt"))])
print("[text_input] ids equal tokenizers' for a directory, .jsonl (ids, blank lines, --text-key / --id-key), "
      "one file, --add-special-tokens; /doc_ids, /bytes, the tokenizer's sha256")
PY
# from the text to a perplexity and bits per byte
mpi 2 run --model "$W/demo" --input "$W/dir.h5" --output "$W/dir.out.h5" >/dev/null
"$DZ" summarize "$W/dir.out.h5" | tee "$W/sum.txt" | tail -1
python3 - "$W" <<'PY'
import math, sys, h5py
W = sys.argv[1]
f, i = h5py.File(f"{W}/dir.out.h5", "r"), h5py.File(f"{W}/dir.h5", "r")
nll, byt = float(f["stats/nll"][:].sum()), int(i["bytes"][:].sum())
line = open(f"{W}/sum.txt").read().strip().splitlines()[-1]
assert f"{byt} bytes" in line and f"{nll / (math.log(2) * byt):.6f} bits per byte" in line, (line, nll, byt)
PY
# refusals, each one line and a non-zero exit
printf '' > "$W/txt/sub/empty.txt"
printf '{"id": 1, "text": "ok"}\nnot json\n' > "$W/bad.jsonl"
refused() {  # $1 = expected message, then the make-input options
  local want=$1; shift
  set +e
  out=$("$DZ" make-input "$@" --out "$W/x.h5" --overwrite 2>&1)
  rc=$?
  set -e
  [ $rc -ne 0 ] && echo "$out" | grep -q -e "$want" || { echo "$out"; echo "FAIL: not refused with '$want'"; exit 1; }
}
refused "document sub/empty.txt .* has no tokens" --text "$W/txt" --tokenizer "$TOK"
refused "bad.jsonl:2: not JSON" --text "$W/bad.jsonl" --tokenizer "$TOK"
refused "no such file" --text "$W/txt" --tokenizer "$W/none"
refused "token id .* >= the vocabulary of" --text "$W/docs.jsonl" --tokenizer "$TOK" --model "$SRC/tests/golden/kimi_linear"
refused "--text and --tokenizer go together" --text "$W/docs.jsonl"
say "make-input --text with the checkpoint's tokenizer: ids equal tokenizers', doc ids, bytes, sha256; text to bits per byte"
