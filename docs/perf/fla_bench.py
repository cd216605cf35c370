"""fla anchor timings at the DESIGN §7 linear-attention shapes (run beside dayzero's bench).

Usage on the GPU machine: PYTHONPATH=.fla python3 docs/perf/fla_bench.py OUT.json
fla is carried as source (never committed); dispatch to optional backends is switched off so the
plain Triton kernels run. Median of triton.testing.do_bench.
"""
import json
import os
import sys
import time

os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
os.environ.setdefault("FLA_FLASH_KDA", "0")
os.environ.setdefault("FLA_TILELANG", "0")
os.environ.setdefault("FLA_INTRACARD_CP", "0")

import torch
import triton

from fla.ops.gated_delta_rule import chunk_gated_delta_rule
from fla.ops.kda import chunk_kda, fused_recurrent_kda

dev = "cuda"
bf = torch.bfloat16
res = []


def dump():
    out = dict(device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               torch=torch.__version__, triton=triton.__version__, results=res)
    with open(sys.argv[1] if len(sys.argv) > 1 else "fla_bench.json", "w") as fh:
        json.dump(out, fh, indent=1)


def bench(name, fn, shape, extra):
    fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
    r = dict(name=name, impl="fla", shape=shape, ms=ms, **extra)
    res.append(r)
    print(f"{name:40s} {shape} {ms:.4f} ms {extra}", flush=True)
    dump()


def prefill_inputs(T, H, K, V):
    q = torch.randn(1, T, H, K, device=dev, dtype=bf)
    k = torch.randn(1, T, H, K, device=dev, dtype=bf)
    v = torch.randn(1, T, H, V, device=dev, dtype=bf)
    b = torch.randn(1, T, H, device=dev, dtype=bf)
    return q, k, v, b


def prefill(H, T=65536, K=128, V=128, gdn=False):
    q, k, v, b = prefill_inputs(T, H, K, V)
    shape = dict(B=1, T=T, H=H, K=K, V=V)
    if gdn:
        gg = -torch.rand(1, T, H, device=dev, dtype=torch.float32) * 0.5
        bench("gdn_chunk", lambda: chunk_gated_delta_rule(
            q, k, v, gg, b.float().sigmoid().to(bf), scale=K ** -0.5, use_qk_l2norm_in_kernel=True,
            output_final_state=True), shape, dict(note="g precomputed (scalar), l2norm in kernel"))
        return
    f = torch.randn(1, T, H, K, device=dev, dtype=bf)
    A_log = torch.rand(H, device=dev, dtype=torch.float32) - 0.5
    dt_bias = torch.randn(H * K, device=dev, dtype=torch.float32) * 0.1
    bench("kda_chunk_gate_in_kernel", lambda: chunk_kda(
        q, k, v, f, b, scale=K ** -0.5, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
        use_beta_sigmoid_in_kernel=True, A_log=A_log, dt_bias=dt_bias, output_final_state=True), shape,
        dict(note="gate, l2norm, sigmoid beta in kernel"))


K, V = 128, 128
prefill(32, gdn=True)
prefill(32)

# decode: one token per sequence, fp32 state [B, H, K, V]
for B in (256, 1):
    H = 32
    q, k, v, b = prefill_inputs(B, H, K, V)
    q, k, v, b = (x.view(B, 1, *x.shape[2:]) for x in (q, k, v, b))
    f = torch.randn(B, 1, H, K, device=dev, dtype=bf)
    A_log = torch.rand(H, device=dev) - 0.5
    dt_bias = torch.randn(H * K, device=dev) * 0.1
    h0 = torch.randn(B, H, K, V, device=dev, dtype=torch.float32) * 0.1
    state_bytes = 2 * h0.numel() * 4  # read + write
    fn = lambda: fused_recurrent_kda(q, k, v, f, b, A_log=A_log, dt_bias=dt_bias, scale=K ** -0.5,
                                     initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                     use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
    r = dict(name="kda_decode", impl="fla", shape=dict(B=B, H=H, K=K, V=V), ms=ms,
             state_TBps=state_bytes / ms / 1e9, note="eager (no graph)")
    res.append(r)
    print(r, flush=True)
    dump()

dump()
for H in (8, 4):
    prefill(H)
