#!/usr/bin/env python3
"""Each dense GEMM's rate in a profiled forward: a cupti_trace.cpp CSV beside the stderr of the same
run with DZ_TRACE_GEMM=1, after `git apply kernels/dev/trace/trace_gemm.patch` (it makes the CUDA
backend print every cuBLAS product's shape; kept out of production until it has run on the GPU).

  python3 kernels/dev/trace/gemm_rates.py trace.csv run_stderr.txt

The window holds the last timed forward; its cuBLAS kernels (by name) are matched in order to the
last as many shape lines of the log (one kernel per cuBLAS call; a count that does not divide the
log's is reported, not guessed). Prints per call and per shape: ms, TFLOP/s.
"""
import csv
import re
import sys
from collections import defaultdict

CUBLAS = re.compile(r"^(nvjet|sm\d+_xmma|cutlass|gemm|ampere|sm90_|sm80_)")


def main():
    rows = list(csv.DictReader(open(sys.argv[1])))
    win = next(r for r in rows if r["kind"] == "window")
    w0, w1 = int(win["start_ns"]), int(win["end_ns"])
    ks = sorted((int(r["start_ns"]), int(r["end_ns"]), r["name"]) for r in rows
                if r["kind"] == "kernel" and w0 <= int(r["start_ns"]) <= w1 and CUBLAS.match(r["name"]))
    shapes = []
    for line in open(sys.argv[2], errors="replace"):
        m = re.search(r"\[dz gemm\] T (\d+) in (\d+) out (\d+) (\S+) -> (\S+)", line)
        if m:
            T, i, o = map(int, m.group(1, 2, 3))
            shapes.append((f"gemm {T}x{i}->{o} {m.group(4)}->{m.group(5)}", 2.0 * T * i * o))
            continue
        m = re.search(r"\[dz head_matmul\] H (\d+) T (\d+) k (\d+) n (\d+)", line)
        if m:
            H, T, k, n = map(int, m.groups())
            shapes.append((f"head_matmul H{H} {T}x{k}->{n}", 2.0 * H * T * k * n))
    if not ks or len(shapes) < len(ks):
        sys.exit(f"{len(ks)} cuBLAS kernels in the window, {len(shapes)} shape lines: cannot match")
    if len(shapes) % len(ks):
        print(f"warning: {len(shapes)} shape lines is not a multiple of the window's {len(ks)} cuBLAS kernels "
              "(a call with two kernels?): matched to the last ones anyway")
    last = shapes[-len(ks):]
    by = defaultdict(lambda: [0.0, 0.0, 0])
    tot_ms = tot_fl = 0.0
    for (t0, t1, name), (shape, fl) in zip(ks, last):
        ms = (t1 - t0) / 1e6
        print(f"{ms:8.3f} ms {fl / ms / 1e9:7.1f} TFLOP/s  {shape:42s} {name[:60]}")
        b = by[shape]
        b[0] += ms
        b[1] += fl
        b[2] += 1
        tot_ms += ms
        tot_fl += fl
    print("by shape:")
    for shape, (ms, fl, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        print(f"{ms:8.3f} ms {n:3d}x {fl / ms / 1e9:7.1f} TFLOP/s  {shape}")
    print(f"all: {tot_ms:.3f} ms, {tot_fl / tot_ms / 1e9:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
