#!/usr/bin/env python3
"""Summarise scripts/ncu-targets.sh's raw Nsight Compute CSVs: one row per profiled launch.

  python3 scripts/ncu_targets.py DIR OUT.json

DIR holds ncu_targets_raw_<target>.csv (`ncu --csv --page raw`, the program's own output mixed in
before the table). Per launch: the kernel, its duration, SM / busiest tensor pipe / L1 / L2 / DRAM
throughput (% of peak), issue-slot activity, achieved occupancy, registers, grid, and the four largest
warp-stall reasons (warps stalled per issued instruction: the larger, the more that reason costs).
Prints a text table and writes the JSON (commit from $DZ_COMMIT).
"""
import csv
import glob
import json
import os
import re
import sys

TIME_UNITS = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def num(s):
    try:
        return float(s.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def short_name(k):
    """`void <unnamed>::mma_prep_kernel<128, 0>(LaPrefill, ...)` -> mma_prep_kernel<128, 0>: the first name
    followed (after its template arguments) by the parameter list"""
    m = re.search(r"([A-Za-z_]\w*)(<[^()]*>)?\(", k)
    return m.group(1) + (m.group(2) or "") if m else k


def read_raw(path):
    """The rows of ncu's raw page as dicts {metric: (value, unit)}; [] when it has none."""
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.reader(lines[start:]))
    if len(rows) < 3:
        return []
    head, units = rows[0], rows[1]
    return [{head[i]: (r[i], units[i]) for i in range(min(len(head), len(r)))} for r in rows[2:] if len(r) > 5]


def pick(m, *names):
    for n in names:
        if n in m:
            v = num(m[n][0])
            if v is not None:
                return v
    return None


def launch_row(m):
    t = m.get("gpu__time_duration.sum")
    us = num(t[0]) * TIME_UNITS.get(t[1], 1.0) if t and num(t[0]) is not None else None
    # the tensor pipe over all its instruction types (mma.sync, wgmma), else the busiest one named
    tensor = None
    all_types = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
    if all_types in m and num(m[all_types][0]) is not None:
        tensor = (all_types.split(".")[0], num(m[all_types][0]))
    else:
        for k, (v, _) in m.items():
            if "pipe_tensor" in k and k.endswith(".avg.pct_of_peak_sustained_active") and num(v) is not None:
                if tensor is None or num(v) > tensor[1]:
                    tensor = (k.split(".")[0], num(v))
    stalls = []
    for k, (v, _) in m.items():
        g = re.match(r"smsp__average_warps?_issue_stalled_(\w+?)_per_issue_active\.ratio$", k)
        if g and num(v) is not None and g.group(1) not in ("not_issued",):
            stalls.append((g.group(1), num(v)))
    stalls.sort(key=lambda s: -s[1])
    return {
        "kernel": short_name(m.get("Kernel Name", ("?", ""))[0]),
        "us": us,
        "sm_pct": pick(m, "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        "tensor_pipe": tensor[0] if tensor else None,
        "tensor_pct": tensor[1] if tensor else None,
        "l1_pct": pick(m, "l1tex__throughput.avg.pct_of_peak_sustained_active"),
        "l2_pct": pick(m, "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        "dram_pct": pick(m, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                         "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        "issue_pct": pick(m, "smsp__issue_active.avg.pct_of_peak_sustained_active"),
        "occupancy_pct": pick(m, "sm__warps_active.avg.pct_of_peak_sustained_active"),
        "registers": pick(m, "launch__registers_per_thread"),
        "grid": pick(m, "launch__grid_size"),
        "stalls": [{"reason": r, "warps_per_issue": round(v, 2)} for r, v in stalls[:4]],
        "device": m.get("device__attribute_display_name", ("", ""))[0] or m.get("Device", ("", ""))[0],
    }


def fmt(v, w, p=1):
    return f"{v:{w}.{p}f}" if isinstance(v, (int, float)) else " " * (w - 1) + "-"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    d, out = sys.argv[1], sys.argv[2]
    targets, device = {}, ""
    for path in sorted(glob.glob(os.path.join(d, "ncu_targets_raw_*.csv"))):
        t = os.path.basename(path)[len("ncu_targets_raw_"):-len(".csv")]
        rows = [launch_row(m) for m in read_raw(path)]
        targets[t] = rows
        device = device or next((r["device"] for r in rows if r["device"]), "")
    print(f"{'target':<15}{'kernel':<44}{'us':>9}{'SM%':>6}{'TC%':>6}{'L1%':>6}{'L2%':>6}{'DRAM%':>6}"
          f"{'iss%':>6}{'occ%':>6}  stalls (warps per issue)")
    for t, rows in targets.items():
        if not rows:
            print(f"{t:<15}(no launches profiled: see ncu_targets_err_{t}.txt)")
        for r in rows:
            st = ", ".join(f"{s['reason']} {s['warps_per_issue']:.2f}" for s in r["stalls"])
            print(f"{t:<15}{r['kernel'][:43]:<44}{fmt(r['us'], 9)}{fmt(r['sm_pct'], 6, 0)}{fmt(r['tensor_pct'], 6, 0)}"
                  f"{fmt(r['l1_pct'], 6, 0)}{fmt(r['l2_pct'], 6, 0)}{fmt(r['dram_pct'], 6, 0)}"
                  f"{fmt(r['issue_pct'], 6, 0)}{fmt(r['occupancy_pct'], 6, 0)}  {st}")
    json.dump({"commit": os.environ.get("DZ_COMMIT", ""), "device": device, "clock_control": "none",
               "targets": targets}, open(out, "w"), indent=1)
    return 0 if any(targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
