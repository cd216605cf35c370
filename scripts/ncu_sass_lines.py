#!/usr/bin/env python3
"""Warp-stall samples per source line, from an Nsight Compute SASS source page and a cubin built here.

  python3 scripts/ncu_sass_lines.py SOURCE.csv CUBIN KERNEL [N]

SOURCE.csv: `ncu -i REP --page source --csv --print-source sass` (scripts/ncu-targets.sh writes it
for the targets in NCU_SOURCE); the GPU machine's ncu gives no CUDA-line view with metrics, only SASS.
CUBIN: the same source compiled on this machine with the production flags plus -lineinfo (the SASS
is the same: -lineinfo adds only the line table), e.g.
  nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a -O3 -DNDEBUG -lineinfo -Ikernels -Ilib \\
       -c kernels/linear_attn_mma.cu -o /tmp/la.o && cuobjdump -xelf all /tmp/la.o
(`cuobjdump` and `nvdisasm` come from PyPI's nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels).
KERNEL: a substring of the kernel's mangled name (`mma_prep_kernelILi128ELb0E`).

An instruction's offset is its address minus the kernel's first; the opcodes at each offset are
compared and the run stops if fewer than 95 % agree (another compiler, other flags, other code).
Prints the source lines with the most samples: share, instructions executed (warp level) and the
largest stall reasons of each.
"""
import csv
import os
import re
import subprocess
import sys
from collections import defaultdict


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(sass):
    toks = sass.strip().split()
    if toks and toks[0].startswith("@"):
        toks = toks[1:]
    return toks[0].rstrip(";") if toks else ""


def read_ncu(path):
    rows = list(csv.reader(open(path)))
    hi = next((i for i, r in enumerate(rows) if r and r[0].strip() == "Address"), None)
    if hi is None:
        sys.exit(f"{path}: no 'Address' header row (not a --print-source sass page?)")
    h = [c.strip() for c in rows[hi]]
    ci = {c: i for i, c in enumerate(h)}
    samp = ci.get("Warp Stall Sampling (All Samples)")
    if samp is None:
        sys.exit(f"{path}: no 'Warp Stall Sampling (All Samples)' column")
    execd = ci.get("Instructions Executed")
    stalls = [(c[len("stall_"):], i) for c, i in ci.items() if c.startswith("stall_") and "Not Issued" not in c]
    body = []
    for r in rows[hi + 1:]:
        if len(r) <= samp or not r[0].startswith("0x"):
            continue
        body.append((int(r[0], 16), r[1], num(r[samp]), num(r[execd]) if execd is not None else 0.0,
                     {name: num(r[i]) for name, i in stalls}))
    if not body:
        sys.exit(f"{path}: no instruction rows")
    a0 = body[0][0]
    return [(a - a0, s, n, e, st) for a, s, n, e, st in body]


def read_cubin(cubin, kernel):
    text = subprocess.run(["nvdisasm", "-g", cubin], capture_output=True, text=True, check=True).stdout
    fn = None
    out = {}
    where = ("?", 0)
    for line in text.splitlines():
        m = re.match(r"^\.text\.(\S+):$", line)
        if m:
            if fn is not None and out:
                break
            fn = m.group(1) if kernel in m.group(1) else None
            continue
        if fn is None:
            continue
        m = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if m:
            where = (m.group(1), int(m.group(2)))
            continue
        m = re.match(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*$", line)
        if m:
            out[int(m.group(1), 16)] = (where, opcode(m.group(2)))
    if not out:
        sys.exit(f"{cubin}: no kernel whose mangled name contains {kernel}")
    return out


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 40
    ins = read_ncu(sys.argv[1])
    dis = read_cubin(sys.argv[2], sys.argv[3])
    agree = sum(1 for off, s, *_ in ins if off in dis and dis[off][1] == opcode(s))
    if agree < 0.95 * len(ins):
        sys.exit(f"only {agree} of {len(ins)} opcodes agree: the cubin is not the profiled code")
    per = defaultdict(lambda: [0.0, 0.0, defaultdict(float)])
    tot = 0.0
    for off, s, smp, ex, st in ins:
        key = dis[off][0] if off in dis else ("?", 0)
        p = per[key]
        p[0] += smp
        p[1] += ex
        for k, v in st.items():
            p[2][k] += v
        tot += smp
    tot = tot or 1.0
    src_cache = {}

    def text(f, ln):
        if f not in src_cache:
            local = os.path.join("kernels", os.path.basename(f))
            path = f if os.path.exists(f) else local
            src_cache[f] = open(path).read().splitlines() if os.path.exists(path) else []
        lines = src_cache[f]
        return lines[ln - 1].strip() if 0 < ln <= len(lines) else ""

    print(f"{agree} of {len(ins)} opcodes agree; warp-stall samples per source line, top {n} of {int(tot)}:")
    for (f, ln), (smp, ex, st) in sorted(per.items(), key=lambda kv: -kv[1][0])[:n]:
        top = sorted(st.items(), key=lambda kv: -kv[1])[:2]
        why = ", ".join(f"{k} {100 * v / smp:.0f}%" for k, v in top if v > 0) if smp else ""
        print(f"  {100 * smp / tot:5.1f} %  {os.path.basename(f)}:{ln:<5} {int(ex):>9} inst  [{why}]  {text(f, ln)[:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
