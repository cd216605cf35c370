#!/usr/bin/env python3
"""The lines or SASS instructions with the most warp-stall samples, from an Nsight Compute source page.

  python3 scripts/ncu_source_top.py SOURCE.csv WHAT [N]

SOURCE.csv: `ncu -i REP --page source --csv --print-source cuda|sass` of a report taken with the
SourceCounters section; WHAT names a row in the printout ("cuda line", "sass instruction"). Exits
non-zero when the page has no stall-sampling column (ncu 2025.3 on the H100 gave the CUDA view
without metrics: then take the SASS view).
"""
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    try:
        rows = list(csv.reader(open(sys.argv[1])))
    except OSError:
        sys.exit("no " + sys.argv[1])
    hi = next((i for i, r in enumerate(rows) if any(c.strip() in ("Source", "# Source", "Address") for c in r)), None)
    if hi is None:
        sys.exit("no header in the CSV: " + " | ".join(rows[0][:6]) if rows else "empty CSV")
    h = rows[hi]

    def col(*keys):
        for i, c in enumerate(h):
            if all(k.lower() in c.lower() for k in keys):
                return i
        return None

    src = col("source")
    samp = col("stall", "sampling", "all") or col("sampling", "all") or col("samples")
    line = col("line") or col("address") or 0
    if samp is None:
        sys.exit("no stall-sampling column: " + " | ".join(h))
    body = [r for r in rows[hi + 1:] if len(r) > max(samp, src or 0)]
    tot = sum(num(r[samp]) for r in body) or 1.0
    print(f"stall samples per {sys.argv[2]} ({h[samp]}), top {n} of {int(tot)}:")
    for r in sorted(body, key=lambda r: -num(r[samp]))[:n]:
        print(f"  {100 * num(r[samp]) / tot:5.1f} %  {r[line]:>6}  {(r[src] if src is not None else '').strip()[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
