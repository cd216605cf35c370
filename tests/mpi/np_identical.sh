#!/usr/bin/env bash
# mpirun -np 1 and -np 4 give bitwise-identical /logprobs on the demo preset (DP deals documents
# to ranks; each document is computed the same way wherever it runs).
source "$(dirname "$0")/lib.sh"
"$DZ" make-model --preset demo --out "$W/m"
edge_tokens 512 "$W/t.txt" 16
"$DZ" make-input --tokens-file "$W/t.txt" --out "$W/in.h5"
mpi 1 run --model "$W/m" --input "$W/in.h5" --output "$W/o1.h5" --report "$W/r1.json"
mpi 4 run --model "$W/m" --input "$W/in.h5" --output "$W/o4.h5" --report "$W/r4.json"
same "$W/o1.h5" "$W/o4.h5" /logprobs /offsets /done
python3 - "$W/r4.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ranks = {d["rank"] for d in r["per_document"]}
assert r["documents"] == 23 and r["world_size"] == 4, r
assert len(ranks) > 1, f"all documents ran on ranks {ranks}: dealing is not spreading work"
print("ranks used:", sorted(ranks))
PY
say "np=1 and np=4 logprobs are bitwise identical"
