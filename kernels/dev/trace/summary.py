#!/usr/bin/env python3
"""Where the GPU is idle inside the profiled window of a cupti_trace.cpp CSV.

  python3 kernels/dev/trace/summary.py trace.csv [out.json]

Prints the window's wall time, the time some kernel / copy / memset was running (their union), the
idle rest, split into the lead-in (window start to the first GPU work), the gaps between GPU
work and the tail; the largest gaps with the work on either side and the host calls that ran
longer than 50 us inside them; GPU time by kernel name; and host runtime calls by name.
"""
import csv
import json
import sys
from collections import defaultdict


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    win = next(r for r in rows if r["kind"] == "window")
    w0, w1 = int(win["start_ns"]), int(win["end_ns"])
    if not (0 < w0 < w1):
        sys.exit(f"no profiler window in {sys.argv[1]} (start {w0}, stop {w1})")
    gpu = sorted(
        (int(r["start_ns"]), int(r["end_ns"]), r["kind"], r["name"])
        for r in rows
        if r["kind"] in ("kernel", "memcpy", "memset") and w0 <= int(r["start_ns"]) <= w1
    )
    api = [
        (int(r["start_ns"]), int(r["end_ns"]), r["name"])
        for r in rows
        if r["kind"] == "api" and w0 <= int(r["start_ns"]) <= w1
    ]
    busy, gaps, cur_end, prev = 0, [], None, None
    for s, e, k, n in gpu:
        if cur_end is None:
            lead = s - w0
        elif s > cur_end:
            gaps.append((s - cur_end, cur_end, s, prev, n))
        if cur_end is None or s > cur_end:
            busy += e - s
            cur_end = e
        elif e > cur_end:
            busy += e - cur_end
            cur_end = e
        prev = n
    tail = w1 - cur_end if cur_end else 0
    wall = w1 - w0
    ms = lambda ns: ns / 1e6
    gap_sum = sum(g[0] for g in gaps)
    print(f"window {ms(wall):.3f} ms: GPU busy {ms(busy):.3f} ms, idle {ms(wall - busy):.3f} ms "
          f"(lead-in {ms(lead):.3f}, {len(gaps)} gaps {ms(gap_sum):.3f}, tail {ms(tail):.3f}); "
          f"{len(gpu)} GPU activities, {len(api)} runtime calls")
    small = [g for g in gaps if g[0] < 10_000]
    print(f"gaps < 10 us: {len(small)}, {ms(sum(g[0] for g in small)):.3f} ms; >= 10 us: "
          f"{len(gaps) - len(small)}, {ms(gap_sum - sum(g[0] for g in small)):.3f} ms")
    print("largest gaps:")
    for g, a, b, p, n in sorted(gaps, reverse=True)[:15]:
        host = [f"{x[2]} {ms(x[1] - x[0]):.3f}" for x in api if x[1] > a and x[0] < b and x[1] - x[0] > 50_000]
        print(f"  {g / 1e3:9.1f} us  after {p[:60]!r}  before {n[:60]!r}  host: {'; '.join(host[:4]) or '-'}")
    by_name = defaultdict(lambda: [0, 0])
    for s, e, k, n in gpu:
        by_name[n][0] += e - s
        by_name[n][1] += 1
    print("GPU time by name:")
    for n, (t, c) in sorted(by_name.items(), key=lambda x: -x[1][0])[:30]:
        print(f"  {ms(t):8.3f} ms {c:4d}x  {n[:110]}")
    by_api = defaultdict(lambda: [0, 0])
    for s, e, n in api:
        by_api[n][0] += e - s
        by_api[n][1] += 1
    print("host runtime calls by name:")
    for n, (t, c) in sorted(by_api.items(), key=lambda x: -x[1][0])[:12]:
        print(f"  {ms(t):8.3f} ms {c:5d}x  {n}")
    if len(sys.argv) > 2:
        json.dump({"window_ms": ms(wall), "busy_ms": ms(busy), "lead_ms": ms(lead), "gaps_ms": ms(gap_sum),
                   "n_gaps": len(gaps), "tail_ms": ms(tail),
                   "largest_gaps_us": [[g / 1e3, p, n] for g, a, b, p, n in sorted(gaps, reverse=True)[:30]],
                   "kernels": {n: {"ms": ms(t), "count": c} for n, (t, c) in by_name.items()},
                   "api": {n: {"ms": ms(t), "count": c} for n, (t, c) in by_api.items()}},
                  open(sys.argv[2], "w"), indent=1)


if __name__ == "__main__":
    main()
