"""PyTorch anchors of issue 12's kernel benches, run beside `dayzero bench dense-attn` / `sparse-attn`
in one device command (scripts/bench-kernels-gpu.sh):

  dense causal attention: torch SDPA with only the flash backend allowed, at T = 8192 and 32768 for
  heads 32 x 128 (MHA), 16 x 256 with 2 KV heads (GQA) and the MLA prefill shape (32 heads, q.k over
  192 dims, v 128), the shapes of kernels/bench_dense_attn.cu;
  the DSA indexer prefill: the naive PyTorch form (scores = sum_h w_h relu(q_h . k), causal mask,
  Top-2048) at T = 32768, 64 heads x 128, bf16, in query blocks so the scores fit in memory, the
  shape of kernels/bench_sparse_attn.cu's indexer_bf16.

Usage on the GPU machine: python3 docs/perf/kernel_anchors.py OUT.json [dense] [indexer]
Timing: median of triton.testing.do_bench where triton imports, else CUDA events (median of 5 after
a warm-up). Where the flash backend refuses a shape (GQA without enable_gqa support, q.k and v of
different widths), the entry says what was done instead (K / V repeated to every query head
outside the timing; v zero-padded to q.k's width, which the FLOP count leaves out) or why none ran.
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

dev = "cuda"
bf = torch.bfloat16
res = []
out_path = sys.argv[1] if len(sys.argv) > 1 else "kernel_anchors.json"
parts = sys.argv[2:] or ["dense", "indexer"]


def dump():
    out = dict(device=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               torch=torch.__version__, results=res)
    with open(out_path, "w") as fh:
        json.dump(out, fh, indent=1)


def median_ms(fn):
    fn()
    torch.cuda.synchronize()
    try:
        import triton.testing
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    except ImportError:
        ts = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        return sorted(ts)[len(ts) // 2]


def record(r):
    res.append(r)
    print(" ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    dump()


def dense():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    shapes = [("mha", 32, 32, 128, 128), ("gqa", 16, 2, 256, 256), ("mla", 32, 32, 192, 128)]
    for what, hq, hkv, dk, dv in shapes:
        for T in (8192, 32768):
            name = f"dense_causal_{what}_T{T}"
            q = torch.randn(1, hq, T, dk, device=dev, dtype=bf)
            k = torch.randn(1, hkv, T, dk, device=dev, dtype=bf)
            v = torch.randn(1, hkv, T, dv, device=dev, dtype=bf)
            note = []
            if dv != dk:  # the flash backend takes one head width for q, k and v
                v = F.pad(v, (0, dk - dv))
                note.append(f"v zero-padded {dv} -> {dk} (flash needs one width; FLOPs counted at Dv = {dv})")
            scale = dk ** -0.5
            flop = hq * (dk + dv) * T * T  # causal: half the scores, 2 FLOP a multiply-add
            ms = None
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                if hkv != hq:
                    try:
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
                        ms = median_ms(fn)
                        note.append("enable_gqa")
                    except (RuntimeError, TypeError) as e:
                        note.append(f"flash refused enable_gqa ({str(e).splitlines()[0][:120]}); K / V repeated "
                                    f"to {hq} heads outside the timing")
                        k = k.repeat_interleave(hq // hkv, dim=1)
                        v = v.repeat_interleave(hq // hkv, dim=1)
                if ms is None:
                    try:
                        ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale))
                    except RuntimeError as e:
                        note.append(f"flash refused: {str(e).splitlines()[0][:160]}")
            r = dict(name=name, impl="torch_sdpa_flash", op="dense_causal", T=T, Hq=hq, Hkv=hkv, Dk=dk, Dv=dv)
            if ms is not None:
                r.update(ms=round(ms, 4), tflops=round(flop / ms * 1e-9, 1))
            r["note"] = "; ".join(note)
            record(r)
            del q, k, v
            torch.cuda.empty_cache()


def indexer(T=32768, H=64, D=128, K=2048, block=1024):
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(T, H, D, device=dev, dtype=bf, generator=g)
    k = torch.randn(T, D, device=dev, dtype=bf, generator=g)
    w = torch.randn(T, H, device=dev, dtype=torch.float32, generator=g) / 90.5
    sel = torch.empty(T, K, device=dev, dtype=torch.int64)
    cols = torch.arange(T, device=dev)

    def run():
        for t0 in range(0, T, block):
            t1 = min(T, t0 + block)
            s = torch.einsum("thd,sd->ths", q[t0:t1], k).relu_()           # [b, H, T] bf16
            sc = torch.einsum("ths,th->ts", s.float(), w[t0:t1])            # [b, T] fp32
            sc.masked_fill_(cols[None, :] > torch.arange(t0, t1, device=dev)[:, None], float("-inf"))
            sel[t0:t1] = sc.topk(K, dim=1).indices
    ms = median_ms(run)
    flop = 2.0 * H * D * (T * (T + 1) / 2)
    record(dict(name="indexer_prefill_bf16", impl="torch_naive", op="indexer_prefill", T=T, heads=H, head_dim=D,
                topk=K, ms=round(ms, 3), tflops_scores=round(flop / ms * 1e-9, 1),
                note=f"query blocks of {block}: all T keys scored (the causal half is masked, not skipped), "
                     "fp32 head sum, torch.topk"))


if "dense" in parts:
    dense()
if "indexer" in parts:
    indexer()
dump()
