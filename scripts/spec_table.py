#!/usr/bin/env python3
"""Markdown tables from a `dayzero bench spec` JSON (docs/speculative.md): per model, batch and
draft count K, the verify step and the restore of each way to undo rejected rows, and the
end-to-end speedups over plain decoding with oracle drafts (the ceiling at that K), n-gram drafts
on repetitive documents and, for a model with an MTP layer, its drafts.
    python3 scripts/spec_table.py SPEC.json
"""
import json
import sys


def f(v, fmt="{:.2f}"):
    return "-" if v is None else fmt.format(v)


def main(path):
    r = json.load(open(path))
    print(f"`{path}`: {r.get('device', '?')}, commit {r.get('commit', '?')}, {r.get('date', '?')}, "
          f"weights {r.get('weights', '?')}\n")
    for x in r["results"]:
        head = f"### {x['model']}, B = {x['batch']}"
        if "error" in x:
            print(f"{head}: stopped: {x['error']}\n")
            continue
        print(f"{head} (plain: {x['plain_decode_ms_per_step']:.2f} ms a step, {x['plain_tok_s']:.0f} tok/s)\n")
        print("| K | verify ms replay / per-token | restore ms replay / per-token | oracle speedup replay / "
              "per-token | oracle acceptance, runs, tokens equal plain: replay / per-token | n-gram speedup "
              "per-token (acceptance) | MTP draft ms, speedup per-token |")
        print("|---|---|---|---|---|---|---|")
        for k in x["per_draft_tokens"]:
            g = k.get

            def acc(h):
                return (f"{f(g(h + '_oracle_acceptance'))}, {g(h + '_oracle_rounds', '-')}, "
                        f"{f(g(h + '_oracle_tokens_equal_plain'))}")
            print(f"| {k['draft_tokens']} | {f(g('replay_verify_ms'))} / {f(g('per_token_verify_ms'))} "
                  f"| {f(g('replay_restore_ms'), '{:.3f}')} / {f(g('per_token_restore_ms'), '{:.3f}')} "
                  f"| {f(g('replay_oracle_speedup'))}x / {f(g('per_token_oracle_speedup'))}x "
                  f"| {acc('replay')} / {acc('per_token')} "
                  f"| {f(g('per_token_ngram_speedup'))}x ({f(g('per_token_ngram_acceptance'))}) "
                  f"| {f(g('mtp_draft_ms'))}, {f(g('per_token_mtp_speedup'))}x |")
        print()


if __name__ == "__main__":
    main(sys.argv[1])
