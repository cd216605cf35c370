#!/usr/bin/env bash
# Bad-input matrix: every case through the real binary (mpirun), printed as a table. Each case must
# give exactly one line starting "dayzero: error:" that names the problem, a non-zero exit, and
# leave an existing result (made by a good run first) byte-identical, with no .part left behind.
# Inputs are made with python3 + h5py (installed quietly when missing) and byte surgery.
source "$(dirname "$0")/lib.sh"
python3 -c "import h5py, numpy" 2>/dev/null || pip install -q h5py numpy >/dev/null 2>&1 ||
  fail "python3 h5py and numpy are needed (pip install h5py numpy)"
"$DZ" make-model --preset demo --out "$W/m" 2>/dev/null
"$DZ" make-model --preset demo --seed 2 --out "$W/m_other" 2>/dev/null  # same shapes, other weights
C=$W/cases
mkdir -p "$C"
python3 - "$W/m" "$C" <<'PY'
import json, os, random, shutil, struct, sys
import h5py, numpy as np
model, C = sys.argv[1], sys.argv[2]
V = json.load(open(os.path.join(model, "config.json")))["vocab_size"]
rng = random.Random(4)

def h5(name, tokens, offsets, tdtype="int32", odtype="int64"):
    with h5py.File(os.path.join(C, name), "w") as f:
        if tokens is not None: f["tokens"] = np.asarray(tokens, dtype=tdtype)
        if offsets is not None: f["offsets"] = np.asarray(offsets, dtype=odtype)

# good input: 6 documents of 1..40 tokens
lens = [1, 2, 7, 40, 13, 30]
toks = [rng.randrange(V) for _ in range(sum(lens))]
offs = np.concatenate([[0], np.cumsum(lens)])
h5("good.h5", toks, offs)
good = open(os.path.join(C, "good.h5"), "rb").read()
open(os.path.join(C, "truncated.h5"), "wb").write(good[: len(good) // 2])
# random bytes over the middle of the file (metadata or data: either must be caught)
mid = bytearray(good); r = random.Random(9)
for i in range(len(mid) // 2 - 128, len(mid) // 2 + 128): mid[i] = r.randrange(256)
open(os.path.join(C, "corrupt_middle.h5"), "wb").write(bytes(mid))
# random bytes over the object headers right after the superblock
hdr = bytearray(good)
for i in range(96, 800): hdr[i] = r.randrange(256)
open(os.path.join(C, "corrupt_header.h5"), "wb").write(bytes(hdr))
open(os.path.join(C, "text.h5"), "w").write("this is not an HDF5 file\n")
h5("float_tokens.h5", np.asarray(toks, dtype="float32"), offs, tdtype="float32")
h5("tokens_2d.h5", np.asarray(toks[:60], dtype="int32").reshape(6, 10), [0, 10, 20, 30, 40, 50, 60])
h5("float_offsets.h5", toks, offs.astype("float64"), odtype="float64")
h5("no_tokens.h5", None, offs)
h5("no_offsets.h5", toks, None)
h5("offsets_not_monotone.h5", toks, [0, 5, 3] + list(offs[3:]))
h5("offsets_past_end.h5", toks, list(offs[:-1]) + [offs[-1] + 5])
h5("token_ge_vocab.h5", toks[:3] + [V] + toks[4:], offs)
h5("token_negative.h5", toks[:3] + [-3] + toks[4:], offs)
h5("zero_length_doc.h5", toks, [0, 1, 1] + list(offs[2:]))
h5("same_lengths.h5", [(t + 1) % V for t in toks], offs)  # other tokens, same documents lengths

# checkpoints: rewrite model.safetensors with one change (header is 8-byte length + JSON)
def read_st(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", None)
    data = {k: (v, b[8 + n + v["data_offsets"][0]: 8 + n + v["data_offsets"][1]]) for k, v in h.items()}
    return meta, data

def write_st(path, meta, data):
    h, blobs, off = {}, [], 0
    if meta is not None: h["__metadata__"] = meta
    for k, (v, raw) in data.items():
        h[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + len(raw)]}
        blobs.append(raw); off += len(raw)
    hj = json.dumps(h).encode()
    hj += b" " * (-len(hj) % 8)
    open(path, "wb").write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))

def variant(name, change):
    d = os.path.join(C, name)
    shutil.copytree(model, d)
    meta, data = read_st(os.path.join(d, "model.safetensors"))
    change(data, d)
    if data: write_st(os.path.join(d, "model.safetensors"), meta, data)  # empty: the change wrote the file

MISSING = "model.layers.1.self_attn.o_proj.weight"
if MISSING not in read_st(os.path.join(model, "model.safetensors"))[1]:
    MISSING = sorted(k for k in read_st(os.path.join(model, "model.safetensors"))[1] if ".layers.1." in k)[0]
variant("m_missing", lambda data, d: data.pop(MISSING))
variant("m_extra", lambda data, d: data.__setitem__("model.layers.0.bogus.weight",
        ({"dtype": "F32", "shape": [4]}, b"\0" * 16)))
def misshape(data, d):
    v, raw = data["model.embed_tokens.weight"]
    r, c = v["shape"]
    data["model.embed_tokens.weight"] = ({"dtype": "F32", "shape": [c, r]}, raw)  # same bytes, transposed shape
variant("m_misshaped", misshape)
def truncate(data, d):
    p = os.path.join(d, "model.safetensors"); b = open(p, "rb").read()
    open(p, "wb").write(b[: len(b) * 2 // 3]); data.clear()
variant("m_truncated", truncate)
def bad_layer(data, d):
    p = os.path.join(d, "config.json"); cfg = json.load(open(p))
    lt = ["linear_attention" if (i + 1) in cfg["linear_attn_config"]["kda_layers"] else "full_attention"
          for i in range(cfg["num_hidden_layers"])]
    lt[-1] = "mamba2"
    cfg["layer_types"] = lt
    json.dump(cfg, open(p, "w"), indent=2)
variant("m_bad_layer", bad_layer)
os.makedirs(os.path.join(C, "m_no_config"))
shutil.copy(os.path.join(model, "model.safetensors"), os.path.join(C, "m_no_config"))
open(os.path.join(C, "missing_tensor_name"), "w").write(MISSING)
PY
MISSING=$(cat "$C/missing_tensor_name")
M=$W/m
GOOD=$C/good.h5
PREV=$W/prev.h5
mpirun -np 1 "$DZ" run --model "$M" --input "$GOOD" --output "$PREV" 2>/dev/null || fail "the good run failed"
cp "$PREV" "$W/prev.orig"
echo "not a directory" >"$W/plainfile"

# case name | np | needle (egrep, case-insensitive) | dayzero run arguments (output: see run_case)
CASES=(
  "input: not HDF5 (text)|1|text\.h5|--input $C/text.h5"
  "input: truncated HDF5|1|truncated\.h5|--input $C/truncated.h5"
  "input: corrupt HDF5 (bytes in the middle)|1|corrupt_middle\.h5|--input $C/corrupt_middle.h5"
  "input: corrupt HDF5 (object headers)|1|corrupt_header\.h5|--input $C/corrupt_header.h5"
  "input: does not exist|1|nope\.h5|--input $C/nope.h5"
  "input: no /tokens|1|/tokens|--input $C/no_tokens.h5"
  "input: no /offsets|1|/offsets|--input $C/no_offsets.h5"
  "input: float32 /tokens|1|/tokens|--input $C/float_tokens.h5"
  "input: 2-D /tokens|1|/tokens|--input $C/tokens_2d.h5"
  "input: float64 /offsets|1|/offsets|--input $C/float_offsets.h5"
  "input: offsets not monotone|1|offsets|--input $C/offsets_not_monotone.h5"
  "input: offsets past the end|1|offsets|--input $C/offsets_past_end.h5"
  "input: token id = vocab|1|512|--input $C/token_ge_vocab.h5"
  "input: token id negative|1|-3|--input $C/token_negative.h5"
  "input: zero-length document|1|empty|--input $C/zero_length_doc.h5"
  "model: no config.json|1|config\.json|--model $C/m_no_config"
  "model: missing tensor|1|$MISSING|--model $C/m_missing"
  "model: extra tensor|1|model\.layers\.0\.bogus\.weight|--model $C/m_extra"
  "model: mis-shaped tensor|1|model\.embed_tokens\.weight|--model $C/m_misshaped"
  "model: truncated safetensors|1|model\.safetensors|--model $C/m_truncated"
  "model: unknown layer type|1|mamba2|--model $C/m_bad_layer"
  "layout: -np 3 --cp 2|3|divisib|--cp 2"
  "output: parent is a file|1|plainfile|OUT=$W/plainfile/out.h5"
  "output: directory missing|1|no_such_dir|OUT=$W/no_such_dir/out.h5"
  "resume: output of another model|1|model|RESUME --model $W/m_other"
  "resume: output of another mode|1|mode|RESUME --mode topk --topk 3"
  "resume: output of another input|1|input|RESUME --input $C/other_input.h5"
  "resume: another input, same doc lengths|1|input|RESUME --input $C/same_lengths.h5"
  "existing output, no --resume/--overwrite|1|--resume|KEEP"
)
# the "another input" case needs a valid, different input
python3 -c "
import h5py, numpy as np
with h5py.File('$C/other_input.h5','w') as f:
    f['tokens']=np.arange(20, dtype='int32'); f['offsets']=np.array([0,5,20], dtype='int64')"

if [ "$(id -u)" -ne 0 ]; then  # permissions only bind non-root users
  mkdir -p "$W/ro" && chmod 555 "$W/ro"
  CASES+=("output: read-only directory|1|ro/out\.h5|OUT=$W/ro/out.h5")
fi

bad=0
rows=()
for c in "${CASES[@]}"; do
  IFS='|' read -r name np needle args <<<"$c"
  out=$PREV
  mode=(--overwrite)
  case $args in
    OUT=*) out=${args#OUT=}; out=${out%% *}; args="" ;;
    RESUME*) mode=(--resume); args=${args#RESUME} ;;
    KEEP) mode=(); args="" ;;
  esac
  # defaults for what the case does not replace
  a=(run)
  [[ " $args " == *" --model "* ]] || a+=(--model "$M")
  [[ " $args " == *" --input "* ]] || a+=(--input "$GOOD")
  read -r -a extra <<<"$args"
  set +e
  mpirun -np "$np" --oversubscribe "$DZ" "${a[@]}" "${extra[@]}" --output "$out" "${mode[@]}" \
    >"$W/stdout.txt" 2>"$W/stderr.txt"
  rc=$?
  set -e
  nerr=$(grep -c '^dayzero: error:' "$W/stderr.txt" || true)
  line=$(grep -m1 '^dayzero: error:' "$W/stderr.txt" || true)
  intact=no
  cmp -s "$W/prev.orig" "$PREV" && [ ! -e "$PREV.part" ] && intact=yes
  verdict=ok
  why=()
  [ "$rc" -ne 0 ] || why+=("exit 0")
  [ "$nerr" = 1 ] || why+=("$nerr error lines")
  [ -n "$line" ] && ! grep -qiE -- "$needle" <<<"$line" && why+=("does not name '$needle'")
  [ "$intact" = yes ] || why+=("previous output changed")
  if [ ${#why[@]} -gt 0 ]; then
    verdict="FAIL (${why[*]})"
    bad=$((bad + 1))
    echo "---- stderr of '$name':"; head -20 "$W/stderr.txt"
    cp "$W/prev.orig" "$PREV"; rm -f "$PREV.part"  # keep later cases meaningful
  fi
  rows+=("$(printf '%-42s %4s  %-6s %-4s %s' "$name" "$rc" "$intact" "$([ "$verdict" = ok ] && echo ok || echo FAIL)" "${line:-<no error line>}")")
  [ "$verdict" = ok ] || rows+=("$(printf '%-42s %s' "" "^ $verdict")")
done
echo
printf '%-42s %4s  %-6s %-4s %s\n' "case" "exit" "intact" "" "error line"
printf '%s\n' "${rows[@]}"
echo
say "${#CASES[@]} cases, $bad failed"
[ "$bad" = 0 ] || fail "$bad bad-input case(s) did not meet the contract"
say "PASS"
