#!/usr/bin/env python3
"""Issue 14's scaling targets from scripts/bench-scaling-gpu.sh's reports (RESULTS/{cp,dp,tp,ep}/*.json,
dayzero --report files named as that script names them, and RESULTS/manifest.json).

  python3 scripts/scaling_targets.py RESULTS [--markdown]

  cp: speed-up over CP = 1 of one document per (model, length): >= 1.8x at CP = 2, >= 3.4x at CP = 4
      (other CP degrees, and a document too long for CP = 1, against the smallest CP run: no target)
  dp: efficiency tokens/s / (DP x tokens/s at DP = 1): >= 0.95
  tp: tokens/s against the smallest TP run (the whole 80B model does not fit one GPU): no target
  ep: expert parallelism against the same layout without it (tokens/s ratio): no target
A missed target is a row that says so, not an error: exit status 0 when the table was made, 2 when
RESULTS holds no report.
"""
import json
import os
import re
import sys

from text_table import print_table

TARGETS_CP = {2: 1.8, 4: 3.4}
TARGET_DP = 0.95


def reports(d):
    out = {}
    if not os.path.isdir(d):
        return out
    for f in sorted(os.listdir(d)):
        if not f.endswith(".json"):
            continue
        try:
            r = json.load(open(os.path.join(d, f)))
        except (OSError, ValueError):
            continue
        if isinstance(r, dict) and "tokens_per_s" in r and "world_size" in r:
            out[f[:-5]] = r
    return out


def rows(res):
    out = []  # (part, run, tokens/s, against, value, target, status)
    cp = reports(os.path.join(res, "cp"))
    groups = {}
    for name, r in cp.items():
        m = re.match(r"(.+)_cp(\d+)$", name)
        if m:
            groups.setdefault(m.group(1), {})[int(m.group(2))] = r
    for g, by in sorted(groups.items()):
        base_c = min(by)
        base = by[base_c]["tokens_per_s"]
        for c in sorted(by):
            tps = by[c]["tokens_per_s"]
            sp = tps / base if base > 0 else float("nan")
            tgt = TARGETS_CP.get(c) if base_c == 1 else None
            out.append(("cp", f"{g} CP={c}", tps, f"CP={base_c}", f"{sp:.2f}x",
                        f">= {tgt}x" if tgt else "—", ("met" if sp >= tgt else "missed") if tgt else "—"))
    dp = reports(os.path.join(res, "dp"))
    by = {int(r.get("dp", r["world_size"])): (n, r) for n, r in dp.items()}
    if 1 in by:
        base = by[1][1]["tokens_per_s"]
        for n in sorted(by):
            tps = by[n][1]["tokens_per_s"]
            eff = tps / (n * base) if base > 0 else float("nan")
            out.append(("dp", by[n][0], tps, "DP=1", f"{eff:.3f}", f">= {TARGET_DP}" if n > 1 else "—",
                        ("met" if eff >= TARGET_DP else "missed") if n > 1 else "—"))
    tp = reports(os.path.join(res, "tp"))
    by = {int(r.get("tp", 1)): (n, r) for n, r in tp.items()}
    if by:
        t0 = min(by)
        for t in sorted(by):
            sp = by[t][1]["tokens_per_s"] / by[t0][1]["tokens_per_s"]
            out.append(("tp", by[t][0], by[t][1]["tokens_per_s"], f"TP={t0}", f"{sp:.2f}x", "—", "—"))
    ep = reports(os.path.join(res, "ep"))
    for name, r in sorted(ep.items()):
        m = re.match(r"(.+)_ep\d+$", name)
        if m and m.group(1) in ep:
            ratio = r["tokens_per_s"] / ep[m.group(1)]["tokens_per_s"]
            out.append(("ep", name, r["tokens_per_s"], m.group(1), f"{ratio:.2f}x", "—", "—"))
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit(__doc__)
    res = args[0]
    rs = rows(res)
    if not rs:
        print(f"scaling_targets: no dayzero report under {res}/{{cp,dp,tp,ep}}", file=sys.stderr)
        return 2
    man = {}
    try:
        man = json.load(open(os.path.join(res, "manifest.json")))
    except (OSError, ValueError):
        pass
    head = ("part", "run", "tokens/s", "against", "speed-up / efficiency", "target", "status")
    title = (f"commit {man.get('commit', '?')}, {man.get('device', '?')} x {man.get('gpus', '?')}, "
             f"{man.get('date', '?')}" + (" (smoke: CPU ranks, numbers mean nothing)" if man.get("smoke") else ""))
    body = [(p, n, f"{t:.0f}", a, v, tg, st) for p, n, t, a, v, tg, st in rs]
    print(title + ("\n" if "--markdown" in sys.argv else ""))
    print_table(head, body, "--markdown" in sys.argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
