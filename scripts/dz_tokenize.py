#!/usr/bin/env python3
"""Tokenizer helper of `dayzero make-input --text PATH --tokenizer MODEL_DIR` (issue 15).

Tokenizes documents with the checkpoint's own tokenizer.json through Hugging Face `tokenizers`
(`pip install tokenizers`) and prints, on stdout, one JSON header line
    {"tokenizer": PATH, "sha256": HEX, "vocab_size": N, "add_special_tokens": BOOL}
then one line per document, in order:
    {"id": STR, "ids": [INT, ...], "bytes": INT}
PATH: a directory (every *.txt file below it, sorted by relative path, id = that path), a .jsonl
file (one JSON object per line with the text under --text-key, default "text", and the id under
--id-key, default "id", else the line number), or any other file (one document, id = its name).
bytes: the document's UTF-8 byte count (bits per byte). Errors go to stderr with a non-zero exit.
"""
import argparse
import hashlib
import json
import os
import sys


def documents(path, text_key, id_key):
    if os.path.isdir(path):
        files = []
        for root, _, names in os.walk(path):
            files += [os.path.join(root, n) for n in names if n.endswith(".txt")]
        if not files:
            sys.exit(f"dz_tokenize: {path}: no *.txt files")
        for f in sorted(files, key=lambda p: os.path.relpath(p, path)):
            with open(f, encoding="utf-8") as h:
                yield os.path.relpath(f, path), h.read()
    elif path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as h:
            for n, line in enumerate(h, 1):
                if not line.strip():
                    continue
                try:
                    o = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"dz_tokenize: {path}:{n}: not JSON ({e})")
                if not isinstance(o, dict) or not isinstance(o.get(text_key), str):
                    sys.exit(f"dz_tokenize: {path}:{n}: no string field '{text_key}'")
                yield str(o.get(id_key, n)), o[text_key]
    else:
        with open(path, encoding="utf-8") as h:
            yield os.path.basename(path), h.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="model directory (its tokenizer.json) or a tokenizer.json")
    ap.add_argument("--text", required=True)
    ap.add_argument("--add-special-tokens", action="store_true", help="the tokenizer's post-processor (e.g. BOS)")
    ap.add_argument("--text-key", default="text")
    ap.add_argument("--id-key", default="id")
    a = ap.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("dz_tokenize: the Python package `tokenizers` is missing: pip install tokenizers")
    tj = a.tokenizer if a.tokenizer.endswith(".json") else os.path.join(a.tokenizer, "tokenizer.json")
    if not os.path.isfile(tj):
        sys.exit(f"dz_tokenize: {tj}: no such file (a model directory with tokenizer.json, or the file)")
    if not os.path.exists(a.text):
        sys.exit(f"dz_tokenize: {a.text}: no such file or directory")
    with open(tj, "rb") as h:
        sha = hashlib.sha256(h.read()).hexdigest()
    tok = Tokenizer.from_file(tj)
    out = sys.stdout
    out.write(json.dumps({"tokenizer": os.path.abspath(tj), "sha256": sha, "vocab_size": tok.get_vocab_size(),
                          "add_special_tokens": a.add_special_tokens}) + "\n")
    for doc_id, text in documents(a.text, a.text_key, a.id_key):
        ids = tok.encode(text, add_special_tokens=a.add_special_tokens).ids
        out.write(json.dumps({"id": doc_id, "ids": ids, "bytes": len(text.encode("utf-8"))}) + "\n")


if __name__ == "__main__":
    main()
