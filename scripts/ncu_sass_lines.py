#!/usr/bin/env python3
"""Warp-stall samples per source line, from an Nsight Compute SASS source page and a cubin built here.

  python3 scripts/ncu_sass_lines.py SOURCE.csv CUBIN KERNEL [N] [--rev COMMIT]

SOURCE.csv: `ncu -i REP --page source --csv --print-source sass` (scripts/ncu-targets.sh writes it
for the targets in NCU_SOURCE); the GPU machine's ncu gives no CUDA-line view with metrics, only SASS.
CUBIN: the same source compiled on this machine with the production flags plus -lineinfo (the SASS
is the same: -lineinfo adds only the line table), e.g.
  nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a -O3 -DNDEBUG -lineinfo -Ikernels -Ilib \\
       -c kernels/linear_attn_mma.cu -o /tmp/la.o && cuobjdump -xelf all /tmp/la.o
(`cuobjdump` and `nvdisasm` come from PyPI's nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels).
KERNEL: a substring of the kernel's mangled name (`mma_prep_kernelILi128ELb0E`). --rev: the
commit whose sources the cubin was built from, for the lines' text (default: the working tree).

An instruction's offset is its address minus the kernel's first; the opcodes at each offset are
compared and the run stops if fewer than 95 % agree (another compiler, other flags, other code).
Prints the source lines with the most samples: share, instructions executed (warp level) and the
largest stall reasons of each. mbarrier wait loops (SYNCS.PHASECHK and the branch back to it) are
counted per barrier address instead: ptxas schedules them after unrelated code and their line
info follows that code (a consumer's full-barrier wait showed as `wgmma_commit`).
"""
import csv
import os
import re
import subprocess
import sys
from collections import defaultdict

from ncu_source_top import num  # ncu's numbers with thousands separators (scripts/ beside this file)


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
    args = sys.argv[1:]
    rev = None
    if "--rev" in args:
        i = args.index("--rev")
        rev = args[i + 1] if i + 1 < len(args) else sys.exit(__doc__)
        del args[i:i + 2]
    if len(args) < 3:
        sys.exit(__doc__)
    n = int(args[3]) if len(args) > 3 else 40
    ins = read_ncu(args[0])
    dis = read_cubin(args[1], args[2])
    agree = sum(1 for off, s, *_ in ins if off in dis and dis[off][1] == opcode(s))
    if agree < 0.95 * len(ins):
        sys.exit(f"only {agree} of {len(ins)} opcodes agree: the cubin is not the profiled code")
    per = defaultdict(lambda: [0.0, 0.0, defaultdict(float)])
    tot = 0.0
    prev = ""
    for off, s, smp, ex, st in ins:
        op = opcode(s)
        if op.startswith("SYNCS.PHASECHK"):
            bar = re.search(r"\[([^\]]+)\]", s)
            prev = "mbarrier wait [" + (bar.group(1) if bar else "?") + "]"
            key = (prev, 0)
        elif op == "BRA" and prev:
            key = (prev, 0)
            prev = ""
        else:
            prev = ""
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
            if rev:
                got = subprocess.run(["git", "show", f"{rev}:{local}"], capture_output=True, text=True)
                src_cache[f] = got.stdout.splitlines() if got.returncode == 0 else []
            else:
                path = f if os.path.exists(f) else local
                src_cache[f] = open(path).read().splitlines() if os.path.exists(path) else []
        lines = src_cache[f]
        return lines[ln - 1].strip() if 0 < ln <= len(lines) else ""

    print(f"{agree} of {len(ins)} opcodes agree; warp-stall samples per source line, top {n} of {int(tot)}:")
    for (f, ln), (smp, ex, st) in sorted(per.items(), key=lambda kv: -kv[1][0])[:n]:
        top = sorted(st.items(), key=lambda kv: -kv[1])[:2]
        why = ", ".join(f"{k} {100 * v / smp:.0f}%" for k, v in top if v > 0) if smp else ""
        where = f"{os.path.basename(f)}:{ln:<5}" if ln else f
        print(f"  {100 * smp / tot:5.1f} %  {where} {int(ex):>9} inst  [{why}]  {text(f, ln)[:80] if ln else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
