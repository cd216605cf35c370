#!/usr/bin/env bash
# The lm-evaluation-harness adapter (python/dayzero_lm_eval, issue 15): `dayzero-lm-eval --model
# dayzero` runs three local JSON tasks (no downloads) on the demo model with the committed tokenizer:
# multiple choice (loglikelihood, one context of ~400 tokens), perplexity (loglikelihood_rolling) and
# generation with stop sequences (generate_until). Every response the harness logged equals the same
# request scored directly by `dayzero run` (log-likelihoods summed from /logprobs in the same order:
# bitwise; is_greedy; generated text decoded and cut at the first stop sequence); the CP 2 x TP 2
# adapter run gives the same log-likelihoods within 1e-3 (the layouts' fp32 reassociation).
# DZ_TEST_BACKEND=cuda runs the adapter and the direct runs on the GPU (by hand: .dev's command D).
source "$(dirname "$0")/lib.sh"
command -v dayzero-lm-eval >/dev/null || { echo "FAIL: dayzero-lm-eval not installed (scripts/test.sh installs python/)"; exit 1; }
"$DZ" make-model --preset demo --out "$W/demo" >/dev/null
cp "$SRC/tests/fixtures/tokenizer/tokenizer.json" "$W/demo/"
mkdir -p "$W/tasks"
python3 - "$W" <<'PY'
import json, sys
W = sys.argv[1]
long_ctx = " ".join(["Long documents are scored one position at a time."] * 40) + " The sky is"
rows = [("The sky is", [" blue", " green", " loud"], 0), ("Two plus two is", [" four", " five"], 0),
        ("Water is ", [" wet", " dry"], 1), ("", [" a", " b"], 0), (long_ctx, [" blue", " red"], 0)]
with open(f"{W}/choice.jsonl", "w") as f:
    for q, c, l in rows:
        f.write(json.dumps({"question": q, "choices": c, "label": l}) + "\n")
with open(f"{W}/ppl.jsonl", "w") as f:
    for t in ["Perplexity is the exponential of the mean negative log-likelihood.", "Straße und 日本語", "x"]:
        f.write(json.dumps({"text": t}) + "\n")
with open(f"{W}/gen.jsonl", "w") as f:
    for p, a in [("Numbers such as", "3"), ("def f(x):", "return"), ("Evaluation harnesses ask", "for")]:
        f.write(json.dumps({"prompt": p, "answer": a}) + "\n")
def task(name, path, kind, body):
    open(f"{W}/tasks/{name}.yaml", "w").write(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {path}\n"
        f"test_split: test\noutput_type: {kind}\n{body}")
task("dz_choice", f"{W}/choice.jsonl", "multiple_choice",
     'doc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\ndoc_to_target: label\nmetric_list:\n  - metric: acc\n')
task("dz_ppl", f"{W}/ppl.jsonl", "loglikelihood_rolling",
     'doc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n  - metric: word_perplexity\n'
     '  - metric: byte_perplexity\n  - metric: bits_per_byte\n')
task("dz_gen", f"{W}/gen.jsonl", "generate_until",
     'doc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["e", "."]\n'
     '  max_gen_toks: 8\n  do_sample: false\nmetric_list:\n  - metric: exact_match\n')
PY
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
run_lme() {  # $1 = output dir, $2 = model_args tail, $3 = tasks
  dayzero-lm-eval --model dayzero --model_args "model=$W/demo,dayzero=$DZ,backend=${DZ_TEST_BACKEND:-cpu},$2" --tasks "$3" \
    --include_path "$W/tasks" --output_path "$1" --log_samples > "$1.log" 2>&1 || { tail -30 "$1.log"; echo "FAIL: dayzero-lm-eval"; exit 1; }
}
run_lme "$W/lme" "np=2" dz_choice,dz_ppl,dz_gen
run_lme "$W/lme_cptp" "np=4,cp=2,tp=2" dz_choice,dz_ppl
grep -E "^\|dz_" "$W/lme.log" | head -3
python3 - "$W" "$DZ" "${DZ_TEST_BACKEND:-cpu}" <<'PY'
import glob, json, subprocess, sys, h5py, numpy as np
from tokenizers import Tokenizer
W, DZ, BK = sys.argv[1:]
tok = Tokenizer.from_file(f"{W}/demo/tokenizer.json")
cfg = json.load(open(f"{W}/demo/config.json"))
prefix = cfg.get("bos_token_id", cfg.get("eos_token_id"))
enc = lambda s: tok.encode(s, add_special_tokens=False).ids if s else []
def samples(d, task):
    (p,) = glob.glob(f"{d}/*/samples_{task}_*.jsonl")
    return [json.loads(l) for l in open(p)]
def pair(ctx, cont):  # lm-eval's HF split: trailing spaces to the continuation, the context a prefix
    n = len(ctx) - len(ctx.rstrip())
    if n:
        ctx, cont = ctx[:-n], ctx[-n:] + cont
    c = enc(ctx)
    return ([prefix], enc(cont)) if not c else (c, enc(ctx + cont)[len(c):])
def direct(docs, sf=None, gen=0):  # the same requests through `dayzero run`
    with h5py.File(f"{W}/direct.h5", "w") as f:
        f["tokens"] = np.array([x for t in docs for x in t], np.int32)
        f["offsets"] = np.cumsum([0] + [len(t) for t in docs]).astype(np.int64)
        if sf is not None:
            f["score_from"] = np.array(sf, np.int64)
    mode = ["--mode", "generate", "--max-new-tokens", str(gen)] if gen else []
    subprocess.run([DZ, "run", "--model", f"{W}/demo", "--input", f"{W}/direct.h5", "--output", f"{W}/direct_out.h5",
                    "--overwrite", "--backend", BK] + mode, check=True, capture_output=True)
    return h5py.File(f"{W}/direct_out.h5", "r")
def loglik(f, sf):
    lp, off, out = f["logprobs"][:], f["offsets"][:], []
    for i, s in enumerate(sf):
        acc = 0.0
        for v in lp[off[i] + s - 1:off[i + 1]]:
            acc -= float(v)
        out.append(-acc)
    return out
# multiple choice: every (context, continuation)
S = samples(f"{W}/lme", "dz_choice")
reqs = [(a["arg_0"], a["arg_1"]) for s in S for a in s["arguments"].values()]
got = [tuple(r[0]) for s in S for r in s["resps"]]
docs, sf = zip(*[(c + k, len(c)) for c, k in (pair(*r) for r in reqs)])
assert max(len(d) for d in docs) > 300, "the long context"
f = direct(list(docs), list(sf))
want = loglik(f, sf)
for i, ((lp, g), w) in enumerate(zip(got, want)):
    assert float(lp) == w, (i, reqs[i], lp, w)
    assert (g == "True") == bool(f["stats/is_greedy"][i]), (i, g)
# rolling: [prefix] + the text, every token
S = samples(f"{W}/lme", "dz_ppl")
docs = [[prefix] + enc(s["arguments"]["gen_args_0"]["arg_0"]) for s in S]
want = loglik(direct(docs, [1] * len(docs)), [1] * len(docs))
for s, w in zip(S, want):
    assert float(s["resps"][0][0]) == w, (s["resps"], w)
# generation: decoded, cut at the first stop sequence
S = samples(f"{W}/lme", "dz_gen")
f = direct([enc(s["arguments"]["gen_args_0"]["arg_0"]) for s in S], gen=8)
g, go = f["generated"][:], f["generated_offsets"][:]
for i, s in enumerate(S):
    text = tok.decode([int(x) for x in g[go[i]:go[i + 1]]], skip_special_tokens=True)
    cut = [text.find(u) for u in s["arguments"]["gen_args_0"]["arg_1"]["until"] if u in text]
    assert s["resps"][0][0] == (text[:min(cut)] if cut else text), (i, s["resps"], text)
# CP x TP: the same log-likelihoods within the layouts' fp32 reassociation
for task in ("dz_choice", "dz_ppl"):
    a = [float(r[0][0] if isinstance(r[0], list) else r[0]) for s in samples(f"{W}/lme", task) for r in s["resps"]]
    b = [float(r[0][0] if isinstance(r[0], list) else r[0]) for s in samples(f"{W}/lme_cptp", task) for r in s["resps"]]
    assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < 1e-3, (task, a, b)
print("[lm_eval] every logged response equals the request scored directly (loglikelihood, rolling, generate_until "
      "with stops); CP 2 x TP 2 within 1e-3")
PY
say "lm-eval adapter: dayzero-lm-eval on local JSON tasks equals direct dayzero runs"
