#!/usr/bin/env python3
"""ab.sh's bench.txt (rows "base#1: kda_chunk_serial  B=1 T=65536 H=32 K=128 V=128  6.123 ms  v4 BV=64 fused ...")
as one line per (kernel, shape): each side's best configuration per repeat, and var / base (with
AB_VAR_ENVS, one line per patched side "var[A=1]" and --wins over the first of them).

  python3 kernels/dev/linear_attn/ab_summary.py BENCH_TXT [--wins]

--wins: exit 0 only when the patched build ("var") is faster than production ("base") at its best
configuration in every repeat of the KDA chunked prefill at H = 32 (GLM-5.3-Flash's and the
issue's shape), and within 2 % of it (the repeats' noise) or faster for every other (kernel, shape)
measured; 1 otherwise (also when that row was not parsed)."""
import re
import sys
from collections import defaultdict

ROW = re.compile(r"^(base|var(?:\[[^\]]*\])?)#(\d+): (\S+)\s+(B=\S+ T=\S+ H=\S+ K=\S+ V=\S+)\s+([0-9.]+) ms")


def main():
    best = defaultdict(lambda: float("inf"))  # (side, rep, kernel, shape) -> ms
    for line in open(sys.argv[1]):
        m = ROW.match(line)
        if m:
            side, rep, kern, shape, ms = m.group(1), int(m.group(2)), m.group(3), m.group(4), float(m.group(5))
            best[side, rep, kern, shape] = min(best[side, rep, kern, shape], ms)
    keys = sorted({(k, s) for (_, _, k, s) in best})
    reps = sorted({r for (_, r, _, _) in best})
    sides = []
    for (side, _, _, _) in best:
        if side != "base" and side not in sides:
            sides.append(side)
    wins = ("kda_chunk_serial", "B=1 T=65536 H=32 K=128 V=128") in keys and bool(sides)
    for side in sides:
        for kern, shape in keys:
            cells = []
            for r in reps:
                b, v = best["base", r, kern, shape], best[side, r, kern, shape]
                cells.append(f"#{r} base {b:.3f} {side} {v:.3f} ({v / b:.3f})")
                lead = kern == "kda_chunk_serial" and " H=32 " in f" {shape} "
                if side == sides[0]:
                    wins = wins and (v < b if lead else v < 1.02 * b)
            print(f"{kern:26s} {shape:30s} " + "; ".join(cells))
    print("var wins (faster at KDA H=32 in every repeat, within 2 % or faster elsewhere)" if wins
          else "var does not win", flush=True)
    return 0 if wins else 1


if __name__ == "__main__":
    sys.exit(main())
