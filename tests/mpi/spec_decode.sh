#!/usr/bin/env bash
# Speculative decoding (DESIGN §11) is lossless for greedy generation: the generated tokens equal
# plain decoding's on every golden family and the demo preset. Drafts: n-gram matches in the
# document (--speculative ngram; with random weights few are proposed), and oracle drafts from a
# greedy run's output with every fifth token changed (--speculative oracle: many proposed, most
# accepted, the changed ones rejected, so the undo runs in every layer), for 1, 4 and 8 draft tokens, one document per forward, packed
# batches (--max-batch-tokens), chunked prefill, CP x TP (2 x 2); a killed speculative run resumed
# equals an uninterrupted one; a greedy run's own output as oracle is accepted whole.
source "$(dirname "$0")/lib.sh"
"$DZ" make-model --preset demo --out "$W/demo"
for name in demo kimi_linear qwen3_next deepseek_v32 glm5_next glm_moe_dsa qwen3_5_moe deepseek_v4 kimi_k3; do
  M=$W/demo
  [ $name = demo ] || M=$SRC/tests/golden/$name
  rep_tokens "$M" "$W/t_$name.txt"
  "$DZ" make-input --tokens-file "$W/t_$name.txt" --out "$W/in_$name.h5" >/dev/null
  a=(--model "$M" --input "$W/in_$name.h5" --mode generate --max-new-tokens 20)
  mpi 1 run "${a[@]}" --output "$W/plain_$name.h5" >/dev/null
  # oracle drafts that are partly right: the greedy tokens with every few changed (rejected there)
  python3 "$SRC/tests/bend_drafts.py" "$W/plain_$name.h5" "$W/bent_$name.h5"
  o=(--speculative oracle --oracle-drafts "$W/bent_$name.h5")
  for k in 1 4 8; do
    mpi 1 run "${a[@]}" "${o[@]}" --draft-tokens $k --output "$W/o${k}_$name.h5" --report "$W/o${k}_$name.json" >/dev/null
    same "$W/plain_$name.h5" "$W/o${k}_$name.h5" /generated /generated_offsets /done
  done
  mpi 1 run "${a[@]}" "${o[@]}" --spec-restore per-token --output "$W/pt_$name.h5" >/dev/null
  same "$W/plain_$name.h5" "$W/pt_$name.h5" /generated /generated_offsets /done
  mpi 1 run "${a[@]}" --speculative ngram --output "$W/ngram_$name.h5" --report "$W/ngram_$name.json" >/dev/null
  same "$W/plain_$name.h5" "$W/ngram_$name.h5" /generated /generated_offsets /done
  mpi 1 run "${a[@]}" "${o[@]}" --max-batch-tokens 256 --output "$W/packed_$name.h5" >/dev/null
  same "$W/plain_$name.h5" "$W/packed_$name.h5" /generated /generated_offsets /done
  mpi 1 run "${a[@]}" "${o[@]}" --max-batch-tokens 32 --output "$W/chunked_$name.h5" >/dev/null
  same "$W/plain_$name.h5" "$W/chunked_$name.h5" /generated /generated_offsets /done
  # the greedy run's own tokens as oracle: every draft accepted
  mpi 1 run "${a[@]}" --speculative oracle --oracle-drafts "$W/plain_$name.h5" --draft-tokens 4 \
    --output "$W/self_$name.h5" --report "$W/self_$name.json" >/dev/null
  same "$W/plain_$name.h5" "$W/self_$name.h5" /generated /generated_offsets /done
  python3 - "$W" "$name" <<'PY'
import json, sys
W, name = sys.argv[1:]
def tot(f):
    r = json.load(open(f"{W}/{f}_{name}.json")); d = r["per_document"]
    return r, sum(x["spec_steps"] for x in d), sum(x["drafts_proposed"] for x in d), sum(x["drafts_accepted"] for x in d)
r, steps, prop, acc = tot("o4")
assert r["speculative"] == "oracle" and r["draft_tokens"] == 4, r
assert 0 < acc < prop, ("oracle drafts with every fifth token changed: some accepted, some rejected", steps, prop, acc)
_, s2, p2, a2 = tot("self")
assert p2 == a2 > 0, ("a greedy run's own tokens are all accepted", s2, p2, a2)
_, s3, p3, a3 = tot("ngram")
print(f"[spec_decode] {name}: oracle(bent) {steps} steps, {prop} drafts, {acc} accepted; "
      f"oracle(self) {s2} steps, {a2} accepted; ngram {s3} steps, {p3} drafts, {a3} accepted")
PY
done
for name in kimi_linear qwen3_5_moe deepseek_v32 deepseek_v4 demo; do
  M=$W/demo
  [ $name = demo ] || M=$SRC/tests/golden/$name
  mpi 4 run --model "$M" --input "$W/in_$name.h5" --mode generate --max-new-tokens 20 --cp 2 --tp 2 \
    --speculative oracle --oracle-drafts "$W/bent_$name.h5" --output "$W/cptp_$name.h5" >/dev/null
  same "$W/plain_$name.h5" "$W/cptp_$name.h5" /generated /generated_offsets /done
  mpi 4 run --model "$M" --input "$W/in_$name.h5" --mode generate --max-new-tokens 20 --cp 2 --tp 2 \
    --speculative oracle --oracle-drafts "$W/bent_$name.h5" --spec-restore per-token --max-batch-tokens 256 \
    --output "$W/cptp_pt_$name.h5" >/dev/null
  same "$W/plain_$name.h5" "$W/cptp_pt_$name.h5" /generated /generated_offsets /done
  # expert parallelism: the verify forwards' MoE experts split over the 4 ranks (members' sums)
  mpi 4 run --model "$M" --input "$W/in_$name.h5" --mode generate --max-new-tokens 20 --cp 2 --tp 2 --ep 4 \
    --speculative oracle --oracle-drafts "$W/bent_$name.h5" --spec-restore replay --output "$W/ep_$name.h5" >/dev/null
  same "$W/plain_$name.h5" "$W/ep_$name.h5" /generated /generated_offsets /done
done
# EOS inside an accepted run of drafts: the demo model with its eos_token_id set to the 6th token
# its plain run generates for document 0 (so that document stops there, mid-step, and the others
# wherever that token comes up); speculative output still equals plain decoding's
mkdir -p "$W/demo_eos" && cp "$W/demo"/* "$W/demo_eos/"
python3 - "$W/plain_demo.h5" "$W/demo_eos/config.json" <<'PY'
import json, sys, h5py
eos = int(h5py.File(sys.argv[1], "r")["/generated"][5])
c = json.load(open(sys.argv[2])); c["eos_token_id"] = eos; json.dump(c, open(sys.argv[2], "w"))
PY
e=(--model "$W/demo_eos" --input "$W/in_demo.h5" --mode generate --max-new-tokens 20)
mpi 1 run "${e[@]}" --output "$W/eos_plain.h5" >/dev/null
mpi 1 run "${e[@]}" --speculative oracle --oracle-drafts "$W/plain_demo.h5" --draft-tokens 8 --output "$W/eos_spec.h5" >/dev/null
same "$W/eos_plain.h5" "$W/eos_spec.h5" /generated /generated_offsets /done
python3 -c "
import h5py; o = h5py.File('$W/eos_plain.h5', 'r')['/generated_offsets'][:]
assert o[1] - o[0] == 6, ('document 0 stops at its 6th token', o[:3])"
# sampled speculative generation does not depend on the rank count (every draw is seeded by
# document and token index), and differs from greedy somewhere
s=(--model "$W/demo" --input "$W/in_demo.h5" --mode generate --max-new-tokens 20 --temperature 0.8 --seed 3
   --speculative oracle --oracle-drafts "$W/bent_demo.h5")
mpi 1 run "${s[@]}" --output "$W/samp1.h5" >/dev/null
mpi 3 run "${s[@]}" --output "$W/samp3.h5" >/dev/null
same "$W/samp1.h5" "$W/samp3.h5" /generated /generated_offsets /done
python3 -c "
import h5py, numpy as np
a, b = (h5py.File(f, 'r')['/generated'][:] for f in ('$W/samp1.h5', '$W/plain_demo.h5'))
assert not np.array_equal(a, b), 'sampled == greedy'"
# killed after a few documents, resumed on another rank count: equal to the uninterrupted run
a=(--model "$W/demo" --input "$W/in_demo.h5" --mode generate --max-new-tokens 20 --speculative oracle
   --oracle-drafts "$W/bent_demo.h5")
killed_run 3 2 "$W/cut.h5" "${a[@]}"
mpi 3 run "${a[@]}" --output "$W/cut.h5" --resume >/dev/null
same "$W/plain_demo.h5" "$W/cut.h5" /generated /generated_offsets /done
# `bench spec` on the CPU (a smoke run: it checks its speculative outputs against plain decoding itself)
"$DZ" bench spec --model "$W/demo" --backend cpu --batches 1,3 --draft-tokens 1,3 --prompt-tokens 32 --new-tokens 8 \
  --repeats 1 --json "$W/bench_spec.json" >/dev/null
python3 - "$W/bench_spec.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert [x["batch"] for x in r["results"]] == [1, 3] and all("error" not in x for x in r["results"]), r
for x in r["results"]:
    assert [k["draft_tokens"] for k in x["per_draft_tokens"]] == [1, 3]
    for k in x["per_draft_tokens"]:
        for h in ("replay", "per_token"):
            assert k[h + "_verify_ms"] > 0 and k[h + "_restore_ms"] >= 0 and k[h + "_oracle_speedup"] > 0, k
            # the CPU's speculative tokens are plain decoding's: the oracle is reproduced at once
            assert k[h + "_oracle_rounds"] == 1 and k[h + "_oracle_tokens_equal_plain"] == 1.0, k
            assert k[h + "_oracle_acceptance"] > 0.9 and k[h + "_ngram_tokens_equal_plain"] == 1.0, k
print("[spec_decode] bench spec: JSON complete")
PY
say "speculative greedy generation equals plain decoding (9 models; oracle drafts 1/4/8, n-gram, replay / per-token, packed, chunked, CP x TP, resumed)"
