#!/usr/bin/env python3
"""Writes a DeepSeek-style FP8 copy of a safetensors checkpoint (NumPy only): every 2-D linear weight
becomes F8_E4M3 codes with NAME_scale_inv, one fp32 scale (amax / 448) per 128 x 128 block, as
DeepSeek-V3 / V3.2 checkpoints hold them; embeddings, the LM head, norms, the MoE router and the
indexer's weights_proj stay as they are. --dequantized DIR also writes the fp32 values the FP8 copy
decodes to (code * scale in fp32), so a run on either must give the same result on the CPU.

    python3 scripts/fp8_checkpoint.py MODEL_DIR OUT_DIR [--dequantized DIR2]
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np

KEEP = ("embed_tokens.", "lm_head.", "norm.", "layernorm.", ".mlp.gate.weight", "weights_proj.")


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", f"{k}: {v['dtype']} (this tool reads F32 checkpoints)"
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[a:b], dtype=np.float32).reshape(v["shape"])
    return out


def write(path, tensors):
    hdr, blobs, off = {}, [], 0
    for k in sorted(tensors):
        a, dt = tensors[k]
        raw = np.ascontiguousarray(a).tobytes()
        hdr[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def e4m3(x):
    """float32 array with |x| <= 448 -> E4M3 ("fn") codes, round to nearest even."""
    a = np.abs(x).astype(np.float64)
    e = np.clip(np.floor(np.log2(np.where(a > 0, a, 1.0))), -6, 8)
    q = np.minimum(np.round(a / 2.0 ** (e - 3)) * 2.0 ** (e - 3), 448.0)  # np.round: half to even
    e2 = np.floor(np.log2(np.where(q > 0, q, 1.0)))
    sub = q < 2.0 ** -6
    exp = np.where(sub, 0, e2 + 7).astype(np.uint8)
    man = np.where(sub, q / 2.0 ** -9, (q / 2.0 ** e2 - 1) * 8).astype(np.uint8)
    return (np.signbit(x).astype(np.uint8) << 7) | (exp << 3) | man


def e4m3_value(c):
    c = c.astype(np.int64)
    s = np.where(c & 0x80, -1.0, 1.0)
    e, m = (c >> 3) & 0xF, c & 7
    return (s * np.where(e == 0, m * 2.0 ** -9, (1 + m / 8.0) * 2.0 ** (e - 7))).astype(np.float32)


def quantize(w):
    R, C = w.shape
    nb, kb = -(-R // 128), -(-C // 128)
    s = np.zeros((nb, kb), np.float32)
    codes = np.zeros((R, C), np.uint8)
    for i in range(nb):
        for j in range(kb):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = np.float32(np.abs(blk).max())
            sc = np.float32(amax / np.float32(448.0)) if amax > 0 else np.float32(1.0)
            s[i, j] = sc
            codes[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = e4m3((blk / sc).astype(np.float32))
    return codes, s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--dequantized")
    a = ap.parse_args()
    t = read(os.path.join(a.model, "model.safetensors"))
    q, dq, n = {}, {}, 0
    for k, w in t.items():
        if w.ndim == 2 and k.endswith(".weight") and not any(p in k for p in KEEP):
            codes, s = quantize(w)
            q[k], q[k + "_scale_inv"] = (codes, "F8_E4M3"), (s, "F32")
            dq[k] = (e4m3_value(codes) * np.repeat(np.repeat(s, 128, 0), 128, 1)[: w.shape[0], : w.shape[1]], "F32")
            n += 1
        else:
            q[k] = dq[k] = (w, "F32")
    for d, ts in ((a.out, q), (a.dequantized, dq)):
        if not d:
            continue
        os.makedirs(d, exist_ok=True)
        cfg = json.load(open(os.path.join(a.model, "config.json")))
        if ts is q:
            cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
        write(os.path.join(d, "model.safetensors"), ts)
    print(f"fp8_checkpoint: {n} weights in FP8 -> {a.out}" + (f", dequantised -> {a.dequantized}" if a.dequantized else ""))


if __name__ == "__main__":
    main()
