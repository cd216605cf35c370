#!/usr/bin/env python3
"""Scaling table and plot from dayzero --report JSON files (e.g. the results of slurm/sweep.sh).

    python3 slurm/summarize.py RESULTS_DIR [--plot FILE.png] [--csv FILE.csv]

Prints one row per run: ranks, nodes, dp, cp, tp, ep, tokens, seconds, tokens/s and the scaling
efficiency against the smallest run (tokens/s per rank, relative to that of the run with the fewest
ranks). Writes a PNG (default RESULTS_DIR/scaling.png) of tokens/s and efficiency against ranks,
one line per (cp, tp, ep); without matplotlib the table is still printed and a message says why no plot.
Nodes come from the report's "nodes" field, else from a sweep name "n<N>_...", else 1.
"""
import argparse
import json
import os
import re
import sys


def load(results):
    runs = []
    for name in sorted(os.listdir(results)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(results, name)
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            print(f"summarize: skipping {name}: {e}", file=sys.stderr)
            continue
        if not isinstance(r, dict) or "tokens_per_s" not in r or "world_size" not in r:
            continue  # not a dayzero report
        m = re.match(r"n(\d+)_", name)
        runs.append({
            "name": name[:-5],
            "ranks": int(r["world_size"]),
            "nodes": int(r.get("nodes", m.group(1) if m else 1)),
            "dp": int(r.get("dp", r["world_size"])),
            "cp": int(r.get("cp", 1)),
            "tp": int(r.get("tp", 1)),
            "ep": int(r.get("ep", 1)),
            "tokens": int(r["tokens"]),
            "seconds": float(r["seconds"]),
            "tps": float(r["tokens_per_s"]),
        })
    runs.sort(key=lambda x: (x["ranks"], x["nodes"], x["cp"], x["tp"], x["ep"], x["name"]))
    return runs


def add_efficiency(runs):
    base = runs[0]  # fewest ranks (ties: first by nodes, cp, tp, name)
    per_rank = base["tps"] / base["ranks"] if base["tps"] > 0 else 0.0
    for r in runs:
        r["eff"] = (r["tps"] / r["ranks"]) / per_rank if per_rank > 0 else float("nan")
    return base


def table(runs):
    head = ("run", "ranks", "nodes", "dp", "cp", "tp", "ep", "tokens", "seconds", "tokens/s", "efficiency")
    rows = [(r["name"], r["ranks"], r["nodes"], r["dp"], r["cp"], r["tp"], r["ep"], r["tokens"], f"{r['seconds']:.2f}",
             f"{r['tps']:.0f}", f"{r['eff']:.2f}") for r in runs]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    lines = ["  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(row, widths)))
             for row in [head] + rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def plot(runs, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("summarize: matplotlib is not installed, so no plot was written "
              "(pip install matplotlib); the table above is complete", file=sys.stderr)
        return False
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = sorted({(r["cp"], r["tp"], r["ep"]) for r in runs})
    for cp, tp, ep in series:
        pts = sorted((r["ranks"], r["tps"], r["eff"]) for r in runs if (r["cp"], r["tp"], r["ep"]) == (cp, tp, ep))
        xs = [p[0] for p in pts]
        label = f"cp {cp}, tp {tp}" + (f", ep {ep}" if ep > 1 else "")
        a1.plot(xs, [p[1] for p in pts], "o-", label=label)
        a2.plot(xs, [p[2] for p in pts], "o-", label=label)
    base = runs[0]
    xs = sorted({r["ranks"] for r in runs})
    a1.plot(xs, [base["tps"] / base["ranks"] * x for x in xs], "k--", lw=0.8, label="ideal")
    a2.axhline(1.0, color="k", ls="--", lw=0.8)
    for a, title, ylabel in ((a1, "throughput", "tokens/s"), (a2, "scaling efficiency", "efficiency")):
        a.set_xscale("log", base=2)
        a.set_xticks(xs)
        a.set_xticklabels([str(x) for x in xs])
        a.set_xlabel("ranks")
        a.set_ylabel(ylabel)
        a.set_title(title)
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    a2.set_ylim(bottom=0)
    fig.suptitle(f"dayzero scaling (efficiency vs {base['name']}, {base['ranks']} rank(s))")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"summarize: wrote {path}")
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="directory of report JSON files")
    ap.add_argument("--plot", help="PNG to write (default RESULTS/scaling.png)")
    ap.add_argument("--csv", help="also write the table as CSV")
    a = ap.parse_args()
    runs = load(a.results)
    if not runs:
        print(f"summarize: no dayzero report JSON in {a.results}", file=sys.stderr)
        return 1
    add_efficiency(runs)
    print(table(runs))
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("run,ranks,nodes,dp,cp,tp,ep,tokens,seconds,tokens_per_s,efficiency\n")
            for r in runs:
                f.write(f"{r['name']},{r['ranks']},{r['nodes']},{r['dp']},{r['cp']},{r['tp']},{r['ep']},{r['tokens']},"
                        f"{r['seconds']:.4f},{r['tps']:.2f},{r['eff']:.4f}\n")
    plot(runs, a.plot or os.path.join(a.results, "scaling.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
