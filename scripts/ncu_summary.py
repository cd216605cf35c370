#!/usr/bin/env python3
"""Where the GPU time of a dayzero run goes, from Nsight Compute's CSV (`ncu --csv --metrics ...`).

  python3 scripts/ncu_summary.py NCU.csv OUT.json [--forwards N] [--title TEXT]

Kernels are grouped by what they do (the name patterns below); per group: kernel time (ncu's
gpu__time_duration, kernels serialised), share, launches, and the time-weighted mean of SM and
DRAM throughput (% of peak) when those metrics were collected: a group near the DRAM ceiling is
memory-bound, one with low SM and low DRAM throughput is latency- or occupancy-bound. --forwards
divides by the number of identical forwards profiled (a bench warm-up + its timed runs). Kernels
that build the model (--dummy-weights fills) are left out.
"""
import csv
import json
import re
import sys
from collections import defaultdict

GROUPS = [  # first match wins (names as ncu prints them, e.g. "void la::<unnamed>::mma_rec_kernel<...>")
    ("model build (dummy fills)", r"fill_dummy"),
    ("MoE routing / dispatch / combine", r"moe_select|k_count|k_scan\b|k_scatter|gather_rows|moe_combine|shared_add|shared_expert"),
    ("MoE expert GEMMs", r"moe_gemm|grouped_gemm"),
    # fp32 SIMT GEMMs: since 9a0362d the mHC stream projections (and routers only on fp32 activations)
    ("fp32 GEMMs (cuBLAS SIMT: mHC projections)", r"f32f32_f32f32|sgemm"),
    # before linear attention: its "la_" matches "sparse_mla_kernel"
    ("sparse MLA / DSA indexer", r"sparse_mla|indexer|topk_from|mxfp8|kpool"),
    ("linear attention (KDA/GDN chunked scan, decode)", r"la::|mma_prep|mma_rec|linear_attn|la_|recurrent|transition|base64_kernel"),
    ("short conv", r"conv_prefill|conv_state|short_conv|conv_update"),
    ("mHC hyper-connections", r"k_hc_"),
    ("softmax attention (flash, warp)", r"flash|attention|attn_|fa_wgmma"),
    ("dense GEMMs (cuBLAS / cuBLASLt)", r"nvjet|gemm|xmma|cutlass|sm90_|Kernel2|gemv|splitKreduce"),
    ("LM head reductions", r"row_max|softmax_parts|row_topk|logsumexp|lm_"),
    ("norms, RoPE, elementwise, copies", r"norm|rope|add|mul|silu|sigmoid|convert|copy|scale|bias|gate|quant|set_i32|iota|embed"),
]


def group_of(name):
    for g, pat in GROUPS:
        if re.search(pat, name, re.I):
            return g
    return "other"


def num(v):
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return None


def main():
    args = sys.argv[1:]
    forwards, title = 1, ""
    if "--forwards" in args:
        i = args.index("--forwards")
        forwards = int(args[i + 1])
        del args[i : i + 2]
    if "--title" in args:
        i = args.index("--title")
        title = args[i + 1]
        del args[i : i + 2]
    src, out = args
    # ncu --csv prints log lines before the table; the table starts at the header with "ID".
    lines = open(src, errors="replace").read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    kern = {}  # id -> {name, metrics}
    for row in csv.DictReader(lines[start:]):
        k = kern.setdefault(row["ID"], {"name": row["Kernel Name"], "m": {}})
        unit, v = row.get("Metric Unit", ""), num(row.get("Metric Value"))
        if v is None:
            continue
        if row["Metric Name"] == "gpu__time_duration.sum":  # to microseconds
            scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6,
                     "second": 1e6}
            if unit not in scale:
                sys.exit(f"ncu_summary: unknown time unit {unit!r}")
            v *= scale[unit]
        k["m"][row["Metric Name"]] = v
    g = defaultdict(lambda: {"us": 0.0, "n": 0, "sm": 0.0, "dram": 0.0, "tc": 0.0})
    names = defaultdict(lambda: {"us": 0.0, "n": 0, "group": ""})
    for k in kern.values():
        us = k["m"].get("gpu__time_duration.sum")
        if us is None:
            continue
        grp = group_of(k["name"])
        if grp.startswith("model build"):
            continue
        e = g[grp]
        e["us"] += us
        e["n"] += 1
        e["sm"] += us * k["m"].get("sm__throughput.avg.pct_of_peak_sustained_elapsed", 0.0)
        e["dram"] += us * k["m"].get("dram__throughput.avg.pct_of_peak_sustained_elapsed", 0.0)
        e["tc"] += us * k["m"].get("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", 0.0)
        short = re.sub(r"\(.*", "", k["name"])[:90]
        names[short]["us"] += us
        names[short]["n"] += 1
        names[short]["group"] = grp
    total = sum(e["us"] for e in g.values())
    groups = []
    for grp, e in sorted(g.items(), key=lambda x: -x[1]["us"]):
        groups.append({
            "group": grp,
            "ms_per_forward": e["us"] / forwards / 1e3,
            "share": e["us"] / total if total else 0.0,
            "launches_per_forward": e["n"] / forwards,
            "sm_throughput_pct": e["sm"] / e["us"] if e["us"] else 0.0,
            "dram_throughput_pct": e["dram"] / e["us"] if e["us"] else 0.0,
            "tensor_pipe_pct": e["tc"] / e["us"] if e["us"] else 0.0,
        })
    top = [{"kernel": n, "group": e["group"], "ms_per_forward": e["us"] / forwards / 1e3,
            "share": e["us"] / total if total else 0.0, "launches_per_forward": e["n"] / forwards}
           for n, e in sorted(names.items(), key=lambda x: -x[1]["us"])[:25]]
    rep = {"title": title, "source": src, "forwards": forwards, "kernel_ms_per_forward": total / forwards / 1e3,
           "groups": groups, "top_kernels": top}
    json.dump(rep, open(out, "w"), indent=1)
    print(f"{title}: {total / forwards / 1e3:.1f} ms of kernels per forward (ncu, serialised)")
    print(f"  {'group':44s} {'ms':>8s} {'share':>6s} {'launch':>7s} {'SM%':>5s} {'DRAM%':>6s} {'TC%':>5s}")
    for r in groups:
        print(f"  {r['group']:44s} {r['ms_per_forward']:8.2f} {100 * r['share']:5.1f}% {r['launches_per_forward']:7.0f} "
              f"{r['sm_throughput_pct']:5.1f} {r['dram_throughput_pct']:6.1f} {r['tensor_pipe_pct']:5.1f}")
    print("  top kernels:")
    for r in top[:12]:
        print(f"    {r['ms_per_forward']:8.2f} ms {100 * r['share']:5.1f}%  x{r['launches_per_forward']:<5.0f} {r['kernel']}")


if __name__ == "__main__":
    main()
