#!/usr/bin/env bash
# --speculative mtp (DESIGN §11, model/mtp.hpp) is lossless: greedy output equals plain decoding's
# on the five families whose MTP layer dayzero runs (DeepSeek-V3.2, GLM-5, Qwen3-Next, the Qwen3.5
# wrapper, DeepSeek-V4: its MTP layer reads the mHC streams), for 1 and 3 drafts, packed, chunked (the MTP prompt rows then come chunk by chunk),
# per-token restore, CP x TP (the MTP prompt rows gathered from the CP ranks), CP x TP with --ep 4, resumed, and sampled
# on 1 and 3 ranks alike. Random MTP weights would propose drafts that are never right, so each
# model's LM head is bent: every row 0 except two tokens at +/- a multiple of hidden unit 0, so the
# argmax is one of the two, chosen by the sign of one coordinate of the final hidden state that the
# whole model computes. The MTP layer (which reads the same head) then guesses right often enough
# that its drafts are accepted and rejected alike, and the undo and the MTP layer's own catch-up
# run over accepted rows (~90 % of the first drafts accepted, ~35 % of all at K = 3).
source "$(dirname "$0")/lib.sh"
bend_head() {  # $1 = model dir (make-model's f32 safetensors)
  python3 - "$1" <<'PY'
import glob, sys
import numpy as np
from safetensors.numpy import load_file, save_file
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    t = load_file(f)
    for k in [k for k in t if (k.endswith("lm_head.weight") and "shared_head" not in k) or k == "head.weight"]:
        w = np.zeros_like(t[k])
        w[3, 0], w[250, 0] = -4.0, 4.0  # tokens 3 and 250 (neither is an EOS id of these configs)
        t[k] = w
    # The DeepSeek-layout models generate 250, 3, 250, 3, ...: the token after next is the current
    # one again, which the random MTP layer (reading the same head) gets the wrong way round. Its
    # final norm negated, it gets it right (the Qwen ones, constant runs, are right as they are).
    for k in [k for k in t if k.endswith("shared_head.norm.weight") or k == "mtp.0.norm.weight"]:
        t[k] = -t[k]
    save_file(t, f)
PY
}
for name in ${DZ_SPEC_MTP_FAMILIES:-deepseek_v32 glm_moe_dsa qwen3_next qwen3_5_moe deepseek_v4}; do
  python3 - "$SRC/tests/golden/$name/config.json" "$W/$name.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
t = j.get("text_config") or j
t["mtp_num_hidden_layers" if t["model_type"].startswith("qwen") else "num_nextn_predict_layers"] = 1
json.dump(j, open(sys.argv[2], "w"))
PY
  M=$W/m_$name
  "$DZ" make-model --preset "$W/$name.json" --out "$M" >/dev/null
  bend_head "$M"
  rep_tokens 256 "$W/t_$name.txt"
  "$DZ" make-input --tokens-file "$W/t_$name.txt" --out "$W/in_$name.h5" >/dev/null
  a=(--model "$M" --input "$W/in_$name.h5" --mode generate --max-new-tokens 20)
  mpi 1 run "${a[@]}" --output "$W/plain_$name.h5" >/dev/null
  for k in 1 3; do
    mpi 1 run "${a[@]}" --speculative mtp --draft-tokens $k --output "$W/mtp${k}_$name.h5" \
      --report "$W/mtp${k}_$name.json" >/dev/null
    same "$W/plain_$name.h5" "$W/mtp${k}_$name.h5" /generated /generated_offsets /done
  done
  m=(--speculative mtp --draft-tokens 3)
  mpi 1 run "${a[@]}" "${m[@]}" --max-batch-tokens 256 --output "$W/packed_$name.h5" >/dev/null
  same "$W/plain_$name.h5" "$W/packed_$name.h5" /generated /generated_offsets /done
  mpi 1 run "${a[@]}" "${m[@]}" --max-batch-tokens 32 --output "$W/chunked_$name.h5" >/dev/null
  same "$W/plain_$name.h5" "$W/chunked_$name.h5" /generated /generated_offsets /done
  mpi 1 run "${a[@]}" "${m[@]}" --spec-restore per-token --output "$W/pt_$name.h5" >/dev/null
  same "$W/plain_$name.h5" "$W/pt_$name.h5" /generated /generated_offsets /done
  mpi 4 run "${a[@]}" "${m[@]}" --cp 2 --tp 2 --output "$W/cptp_$name.h5" >/dev/null
  same "$W/plain_$name.h5" "$W/cptp_$name.h5" /generated /generated_offsets /done
  # expert parallelism (the model's and the MTP layer's MoE experts split over all 4 ranks)
  mpi 4 run "${a[@]}" "${m[@]}" --cp 2 --tp 2 --ep 4 --output "$W/ep_$name.h5" >/dev/null
  same "$W/plain_$name.h5" "$W/ep_$name.h5" /generated /generated_offsets /done
  python3 - "$W" "$name" <<'PY'
import json, sys
W, name = sys.argv[1:]
for k in (1, 3):
    r = json.load(open(f"{W}/mtp{k}_{name}.json")); d = r["per_document"]
    assert r["speculative"] == "mtp" and r["draft_tokens"] == k, r
    steps, prop, acc = (sum(x[f] for x in d) for f in ("spec_steps", "drafts_proposed", "drafts_accepted"))
    assert 0 < acc < prop, ("MTP drafts: some accepted, some rejected", k, steps, prop, acc)
    print(f"[spec_mtp] {name} K={k}: {steps} steps, {prop} MTP drafts, {acc} accepted")
PY
done
# sampled: independent of the rank count; killed and resumed on another rank count
M=$W/m_qwen3_5_moe
s=(--model "$M" --input "$W/in_qwen3_5_moe.h5" --mode generate --max-new-tokens 20 --temperature 0.8 --seed 3
   --speculative mtp --draft-tokens 3)
mpi 1 run "${s[@]}" --output "$W/samp1.h5" >/dev/null
mpi 3 run "${s[@]}" --output "$W/samp3.h5" >/dev/null
same "$W/samp1.h5" "$W/samp3.h5" /generated /generated_offsets /done
a=(--model "$W/m_deepseek_v32" --input "$W/in_deepseek_v32.h5" --mode generate --max-new-tokens 20 --speculative mtp)
killed_run 3 2 "$W/cut.h5" "${a[@]}"
mpi 3 run "${a[@]}" --output "$W/cut.h5" --resume >/dev/null
same "$W/plain_deepseek_v32.h5" "$W/cut.h5" /generated /generated_offsets /done
# `bench spec` measures MTP drafts for a model that has an MTP layer (and checks its outputs itself)
"$DZ" bench spec --model "$W/m_qwen3_next" --backend cpu --batches 1,2 --draft-tokens 1,3 --prompt-tokens 32 \
  --new-tokens 8 --repeats 1 --json "$W/bench_spec.json" >/dev/null
python3 - "$W/bench_spec.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert all("error" not in x for x in r["results"]), r
for x in r["results"]:
    for k in x["per_draft_tokens"]:
        assert k["mtp_draft_ms"] > 0, k
        for h in ("replay", "per_token"):
            assert k[h + "_mtp_speedup"] > 0 and k[h + "_mtp_draft_s"] > 0 and 0 <= k[h + "_mtp_acceptance"] <= 1, k
print("[spec_mtp] bench spec: MTP draft cost and end-to-end MTP runs in the JSON")
PY
say "--speculative mtp equals plain greedy decoding (DeepSeek-V3.2, GLM-5, Qwen3-Next, Qwen3.5 wrapper; K 1/3, packed, chunked, per-token, CP x TP, resumed; sampled np1 == np3)"
