#!/usr/bin/env bash
# DESIGN §7 end to end, in ONE command on the GPU machine: the transformers + fla anchor
# (../shared/anchors/e2e_transformers.py, fla as source on the PYTHONPATH) beside `dayzero bench e2e`
# on the same shapes (configs/bench, dummy bf16 weights, one document of 8192 / 32768 tokens,
# last-logits and logprobs, median of 3), then the whole 27-layer Kimi-Linear-48B-A3B with
# --dummy-weights scoring one 131072-token document, and 256 documents of 2048 tokens with and
# without packing. JSON into LOG_DIR; a summary of the ratios on stdout.
#   bash scripts/bench-e2e-gpu.sh PREFIX BUILD_DIR LOG_DIR FLA_SRC ANCHOR_PY [parts...]
# parts: anchor e2e decode decodeb ncu k131k docs256 (default: all), and the 2026 shapes:
#   anchor26: the anchor's 2026 set (Qwen3.5-35B-A3B 8 layers, GLM-5.3-Flash 4 layers) with the
#             transformers 5.23 site in $TF523 (pip install --no-deps --target) on the PYTHONPATH
#   e2e26:    dayzero on configs/bench/qwen3_5_35b_a3b_8l (8192 / 32768, last-logits and logprobs)
#             and the whole 40-layer Qwen3.5-35B-A3B wrapper (--dummy-weights, 32768, last-logits), and
#             GLM-5.3-Flash cut to 4 layers (3 KDA + 1 DSA, as the anchor) at 8192 / 32768
#   decode: generate mode, 33 new tokens after the 8192 / 32768-token prompt (ms per decode step),
#           with CUDA graphs (the default) and --eager-decode
#   decodeb: 32 documents of 2048 tokens prefilled in one packed forward and decoded together
#           (generate, 17 new tokens: decode tokens/s of the batch)
#   spec:   `bench spec` (speculative decoding) on the two 8-layer shapes, B = 1 and 64, K = 1, 2, 4, 8:
#           verify and restore costs (replay, per-token), speedups with oracle and n-gram drafts
#   ncu:    Nsight Compute (--clock-control none) over one timed last-logits forward at T=32768 of
#           each 8-layer shape: kernel time by group (scripts/ncu_summary.py)
#   ncu26:  the same over the 2026 shapes (Qwen3.5 8 layers, GLM-5.3-Flash 4 layers) at T=8192
#   e2e26b: the 2026 shapes with no transformers anchor here: Kimi K3 cut to 4 layers (MXFP4 experts
#           kept 4-bit; 8192 / 32768, last-logits and logprobs) and DeepSeek-V4-Flash cut to its first
#           8 layers (8192, last-logits)
#   e2e26c: GLM-5 cut to its first 6 layers (3 dense + 3 MoE, MLA + DSA throughout), 8192 / 32768
#   e2e26fit: GLM-5.3-Flash cut to as many of its first layers as one H200 holds (`dayzero plan`):
#           12 at 8192, 11 at 32768 (last-logits; ~130 GiB of dummy weights each)
# The device tool returns a bounded number of files per command (8 on 2026-12-01; a ninth JSON
# was left out): tar LOG_DIR into one file under $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${1:?prefix}; B=${2:?build dir}; L=${3:?log dir}; FLA=${4:?fla source dir}; ANCHOR=${5:?e2e_transformers.py}
shift 5
parts=${*:-anchor e2e decode decodeb ncu k131k docs256}
mkdir -p "$L"
[[ -x $B/dayzero ]] || DZ_TARGETS="dayzero" bash scripts/offline-prefix.sh build "$P" "$B" 2>&1 | grep -E '^\[offline-prefix\]|error'
eval "$(bash scripts/offline-prefix.sh env "$P")"
# The JSONs' commit: pass DZ_COMMIT=<hash> in the device command. The device tool's copy of the tree
# can carry stale git metadata (2026-12-02: the session's first commit, not the tree's), so the
# fallback below may name the wrong commit.
export DZ_COMMIT=${DZ_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
DZ=$B/dayzero
has() { [[ " $parts " == *" $1 "* ]]; }
# The anchor must run fla's kernels: transformers silently falls back to its PyTorch reference
# (several times slower) when `import fla` fails, e.g. with fla packed one directory too deep.
if has anchor || has anchor26; then
  PYTHONPATH="$FLA" python3 -c "import fla.ops.kda, fla.ops.gated_delta_rule" ||
    { echo "bench-e2e-gpu: fla does not import from $FLA (PYTHONPATH must hold the directory that contains fla/)"; exit 1; }
fi
if has anchor; then
  PYTHONPATH="$FLA${PYTHONPATH:+:$PYTHONPATH}" python3 "$ANCHOR" "$L/e2e_transformers.json" 2025 sdpa 2>&1 |
    grep -v Warning | tail -8
fi
if has anchor26; then
  PYTHONPATH="$FLA:${TF523:?set TF523 to a transformers 5.23 site}${PYTHONPATH:+:$PYTHONPATH}" \
    python3 "$ANCHOR" "$L/e2e_transformers_2026.json" 2026 2>&1 | grep -v Warning | tail -4
fi
if has e2e26; then
  "$DZ" bench e2e --model configs/bench/qwen3_5_35b_a3b_8l --tokens 8192,32768 --modes last-logits,logprobs \
    --repeats 3 --json "$L/e2e_dayzero_2026.json" 2>&1 | grep -v '^{'
  "$DZ" bench e2e --model configs/bench/qwen3_5_35b_a3b --tokens 32768 --modes last-logits \
    --repeats 3 --json "$L/e2e_dayzero_2026_full.json" 2>&1 | grep -v '^{'
  "$DZ" bench e2e --model configs/bench/glm5_3_flash_4l --tokens 8192,32768 --modes last-logits \
    --repeats 3 --json "$L/e2e_dayzero_2026_glm.json" 2>&1 | grep -v '^{'
fi
if has e2e26b; then
  "$DZ" bench e2e --model configs/bench/kimi_k3_4l --tokens 8192,32768 --modes last-logits,logprobs \
    --repeats 3 --json "$L/e2e_dayzero_2026_k3.json" 2>&1 | grep -v '^{'
  "$DZ" bench e2e --model configs/bench/deepseek_v4_flash_8l --tokens 8192 --modes last-logits \
    --repeats 3 --json "$L/e2e_dayzero_2026_dsv4.json" 2>&1 | grep -v '^{'
fi
if has e2e26c; then  # GLM-5 (no anchor shape in the anchor script either), its first 6 layers
  "$DZ" bench e2e --model configs/bench/glm5_6l --tokens 8192,32768 --modes last-logits \
    --repeats 3 --json "$L/e2e_dayzero_2026_glm5.json" 2>&1 | grep -v '^{'
fi
if has e2e26fit; then  # GLM-5.3-Flash as many layers as fit (no anchor: transformers cannot hold them)
  "$DZ" bench e2e --model configs/bench/glm5_3_flash_12l --tokens 8192 --modes last-logits \
    --repeats 3 --json "$L/e2e_dayzero_2026_glm_12l.json" 2>&1 | grep -v '^{'
  "$DZ" bench e2e --model configs/bench/glm5_3_flash_11l --tokens 32768 --modes last-logits \
    --repeats 3 --json "$L/e2e_dayzero_2026_glm_11l.json" 2>&1 | grep -v '^{'
fi
if has e2e; then
  "$DZ" bench e2e --model configs/bench/kimi_linear_48b_a3b_8l --model configs/bench/qwen3_next_80b_a3b_8l \
    --tokens 8192,32768 --modes last-logits,logprobs --repeats 3 --json "$L/e2e_dayzero.json" 2>&1 | grep -v '^{'
fi
if has decode; then
  "$DZ" bench e2e --model configs/bench/kimi_linear_48b_a3b_8l --model configs/bench/qwen3_next_80b_a3b_8l \
    --tokens 8192,32768 --modes generate --new-tokens 33 --repeats 3 --json "$L/decode_dayzero.json" 2>&1 | grep -v '^{'
  "$DZ" bench e2e --model configs/bench/kimi_linear_48b_a3b_8l --model configs/bench/qwen3_next_80b_a3b_8l \
    --tokens 8192,32768 --modes generate --new-tokens 33 --repeats 3 --eager-decode \
    --json "$L/decode_dayzero_eager.json" 2>&1 | grep -v '^{'
fi
if has decodeb; then
  "$DZ" bench e2e --model configs/bench/kimi_linear_48b_a3b_8l --model configs/bench/qwen3_next_80b_a3b_8l \
    --tokens 2048 --batch 32 --modes generate --new-tokens 17 --repeats 2 --json "$L/decode_batch32_dayzero.json" 2>&1 |
    grep -v '^{'
fi
if has spec; then  # speculative decoding (issue 13): verify / restore per K, oracle and n-gram speedups
  "$DZ" bench spec --model configs/bench/kimi_linear_48b_a3b_8l --model configs/bench/qwen3_next_80b_a3b_8l \
    --batches 1,64 --draft-tokens 1,2,4,8 --prompt-tokens 2048 --new-tokens 64 --repeats 3 \
    --json "$L/spec_dayzero.json" 2>&1 | grep -v '^{'
fi
ncu_over() {  # $1 = tokens, $2.. = models: kernel time by group (scripts/ncu_summary.py)
  local T=$1 m
  shift
  for m in "$@"; do
    ncu --clock-control none --profile-from-start off --csv --log-file "$L/ncu_$m.csv" \
      --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      "$DZ" bench e2e --model "configs/bench/$m" --tokens "$T" --modes last-logits --repeats 1 >/dev/null 2>&1 ||
      echo "ncu over $m failed (see $L/ncu_$m.csv)"
    python3 scripts/ncu_summary.py "$L/ncu_$m.csv" "$L/ncu_$m.json" --title "$m T=$T last-logits" || true
  done
}
if has ncu; then ncu_over 32768 kimi_linear_48b_a3b_8l qwen3_next_80b_a3b_8l; fi
if has ncu26; then ncu_over 8192 qwen3_5_35b_a3b_8l glm5_3_flash_4l; fi
W=$(mktemp -d)
K=configs/bench/kimi_linear_48b_a3b
if has k131k; then
  "$DZ" make-input --docs 1 --min-len 131072 --max-len 131072 --vocab 163840 --out "$W/k131k.h5" >/dev/null
  "$DZ" run --model "$K" --dummy-weights --backend cuda --mode logprobs --max-batch-tokens 32768 \
    --input "$W/k131k.h5" --output "$W/k131k.out.h5" --report "$L/kimi48b_131k_logprobs_report.json" 2>&1 | tail -2
fi
if has docs256; then
  "$DZ" make-input --docs 256 --min-len 2048 --max-len 2048 --vocab 163840 --out "$W/d256.h5" >/dev/null
  for mbt in 32768 0; do
    "$DZ" run --model "$K" --dummy-weights --backend cuda --mode logprobs --max-batch-tokens $mbt \
      --input "$W/d256.h5" --output "$W/d256.$mbt.h5" --report "$L/kimi48b_256x2048_mbt$mbt.json" 2>&1 | tail -1
  done
fi
python3 - "$L" <<'PY'
import json, os, sys
L = sys.argv[1]
def load(n):
    p = os.path.join(L, n)
    return json.load(open(p)) if os.path.exists(p) else None
a = [load(n) for n in ("e2e_transformers.json", "e2e_transformers_2026.json")]
d = [load(n) for n in ("e2e_dayzero.json", "e2e_dayzero_2026.json", "e2e_dayzero_2026_full.json",
                       "e2e_dayzero_2026_glm.json", "e2e_dayzero_2026_k3.json", "e2e_dayzero_2026_dsv4.json",
                       "e2e_dayzero_2026_glm5.json", "e2e_dayzero_2026_glm_12l.json", "e2e_dayzero_2026_glm_11l.json")]
if any(d):
    anchor = {(r["model"], r["T"]): r for x in a for r in (x or {}).get("results", []) if "model" in r and "ms" in r}
    for r in [r for x in d for r in (x or {}).get("results", [])]:
        if "error" in r:
            print("dayzero", r["model"], r["T"], r["mode"], "ERROR", r["error"]); continue
        name = r["model"].replace("_8l", "").replace("_4l", "")
        x = anchor.get((name, r["T"]))
        if x and x.get("layers") != r.get("layers"):
            x = None  # the anchor cut the shape to fewer layers: no ratio
        ratio = f"{x['ms'] / r['ms']:.2f}x transformers+fla ({x['ms']:.1f} ms)" if x and r["mode"] == "last-logits" else ""
        ok = r["plan_peak_gib"] >= r["peak_gib"] and abs(r["plan_weight_gib"] - (r["weight_gib"] - 1 / 32)) < 0.02 * r["weight_gib"]
        print(f"dayzero {r['model']} T={r['T']} {r['mode']}: {r['ms']:.1f} ms, {r['tok_s']:.0f} tok/s, MFU {100 * r['mfu_dense']:.1f} % "
              f"({100 * r['mfu_with_attention']:.1f} % with attention), peak {r['peak_gib']:.2f} GiB (plan {r['plan_peak_gib']:.2f}, "
              f"{'ok' if ok else 'PLAN OFF'}) {ratio}")
eager = {(r["model"], r["T"]): r for r in (load("decode_dayzero_eager.json") or {}).get("results", [])}
for r in (load("decode_dayzero.json") or {}).get("results", []):
    if "decode_ms_per_token" in r:
        e = eager.get((r["model"], r["T"]), {})
        vs = f"; eager {e['decode_ms_per_token']:.2f} ms ({e['decode_ms_per_token'] / r['decode_ms_per_token']:.2f}x)" if "decode_ms_per_token" in e else ""
        print(f"decode {r['model']} after T={r['T']}: {r['decode_ms_per_token']:.2f} ms per token with CUDA graphs "
              f"({r['new_tokens']} new tokens, whole call {r['ms']:.1f} ms){vs}")
for r in (load("decode_batch32_dayzero.json") or {}).get("results", []):
    if "decode_tok_s" in r:
        print(f"decode {r['model']} {r['batch']} documents of {r['T']} together: {r['decode_ms_per_token']:.2f} ms per step, "
              f"{r['decode_tok_s']:.0f} tokens/s (the whole call, the prefill of all {r['batch'] * r['T']} tokens included: {r['ms']:.0f} ms)")
for n in ("kimi48b_131k_logprobs_report.json", "kimi48b_256x2048_mbt32768.json", "kimi48b_256x2048_mbt0.json"):
    r = load(n)
    if r:
        pr = r.get("per_rank", [{}])[0]
        comp = sum(x["seconds"] for x in r.get("per_document", []))
        print(f"{n}: {r['tokens']} tokens, compute {comp:.2f} s ({r['tokens'] / max(comp, 1e-9):.0f} tok/s); job {r['seconds']:.1f} s "
              f"incl. load {r.get('load_seconds', 0):.1f} s; peak {pr.get('peak_device_memory_bytes', 0) / 2**30:.2f} GiB")
PY
rm -rf "$W"
