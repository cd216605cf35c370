#!/usr/bin/env python3
"""Writes the committed seed corpora of the libFuzzer harnesses (tests/fuzz/seeds/, docs/fuzzing.md).

    python3 tests/fuzz/make_seeds.py [--dayzero build/dayzero]

safetensors/  needs only the standard library: checkpoints in every dtype, FP8 block scales, the
              sharded layout, a multimodal wrapper's names, and one real header (a golden model's
              tensor names with every dimension cut to <= 2), in the harness's input layout
              (a mode byte, then the file or the index + shards, see fuzz_safetensors.cpp).
config/       two hand-made configs (Moonshot's 1-indexed layer lists; a wrapper with a bad
              text_config); tests/CMakeLists.txt adds every golden and configs/ config.json.
input/        HDF5 input files: `dayzero make-input` (when --dayzero is given) and h5py variants
              (chunked + gzip, other integer types and byte orders, libver latest, the error cases
              of DESIGN §3: missing datasets, non-monotone offsets, empty documents, ids >= vocab).
              Needs h5py and numpy (/work/venv/bin/python has them).
../findings/  safetensors/ and config/: the inputs that showed the UB found by fuzzing and by
              hand (docs/fuzzing.md), replayed by the fuzz_*_seeds tests. findings/input/ holds
              fuzzer-made files (not written here).
Re-running it rewrites the same files (h5py files may differ byte-wise between h5py versions).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEEDS = os.path.join(HERE, "seeds")
FINDINGS = os.path.join(HERE, "findings")  # inputs that once crashed a harness (regressions)
SEP = b"\n--SHARD--\n"  # fuzz_safetensors.cpp's shard separator

DTYPE_SIZE = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "I32": 4, "I64": 8, "U8": 1}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape[, raw bytes]) -> file bytes (header padded to 8)."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    blob = b""
    for t in tensors:
        name, dtype, shape = t[:3]
        nb = numel(shape) * DTYPE_SIZE[dtype]
        raw = t[3] if len(t) > 3 else bytes((i * 37 + 11) & 0x7F for i in range(nb))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def write(sub, name, data, base=SEEDS):
    d = os.path.join(base, sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors_seeds():
    single = lambda b, mode=0: bytes([mode]) + b
    write("safetensors", "f32_two", single(safetensors(
        [("model.embed_tokens.weight", "F32", [4, 2]), ("model.norm.weight", "F32", [2])], {"format": "pt"})))
    write("safetensors", "every_dtype", single(safetensors(
        [("a.bf16", "BF16", [3, 2]), ("b.f16", "F16", [5]), ("c.f8", "F8_E4M3", [2, 8]), ("d.i32", "I32", [3]),
         ("e.i64", "I64", [2]), ("f.u8", "U8", [7]), ("g.f32", "F32", [1, 1, 2])])))
    # DeepSeek FP8: W [130, 3] E4M3 with W_scale_inv [2, 1] (one scale per 128x128 block, edges partial)
    write("safetensors", "fp8_block_scales", single(safetensors(
        [("model.layers.0.mlp.down_proj.weight", "F8_E4M3", [130, 3]),
         ("model.layers.0.mlp.down_proj.weight_scale_inv", "F32", [2, 1], struct.pack("<2f", 0.5, 2.0))])))
    write("safetensors", "fp8_bad_scale_shape", single(safetensors(
        [("w", "F8_E4M3", [4, 4]), ("w_scale_inv", "F32", [2, 2])])))
    write("safetensors", "fp8_1d_with_scale", single(safetensors([("w", "F8_E4M3", [16]), ("w_scale_inv", "F32", [1])])))
    # compressed-tensors MXFP4 (Kimi K3's experts): X.weight_packed U8 [R, C/2] + X.weight_scale U8
    # [R, C/32] read as X.weight; a scale of 0xFF is refused; a pair of another shape stays two tensors
    mx = "model.layers.1.block_sparse_moe.experts.0.w1.weight"
    write("safetensors", "mxfp4_pair", single(safetensors(
        [(mx + "_packed", "U8", [3, 32]), (mx + "_scale", "U8", [3, 2], bytes([127, 120, 1, 0, 130, 200]))])))
    write("safetensors", "mxfp4_nan_scale", single(safetensors(
        [(mx + "_packed", "U8", [2, 16]), (mx + "_scale", "U8", [2, 1], bytes([127, 255]))])))
    write("safetensors", "mxfp4_odd_shape", single(safetensors(
        [(mx + "_packed", "U8", [2, 15]), (mx + "_scale", "U8", [2, 1])])))
    write("safetensors", "empty_and_scalar", single(safetensors(
        [("z", "F32", [0, 4]), ("s", "F32", []), ("e", "BF16", [3, 0, 2])])))
    write("safetensors", "no_tensors", single(safetensors([], {"format": "pt"})))
    wrapper = safetensors([("model.language_model.layers.0.self_attn.q_proj.weight", "BF16", [2, 2]),
                           ("model.language_model.embed_tokens.weight", "BF16", [3, 2]),
                           ("model.visual.patch_embed.proj.weight", "BF16", [2]),
                           ("lm_head.weight", "BF16", [3, 2])])
    write("safetensors", "wrapper_rename", single(wrapper, 8))
    write("safetensors", "wrapper_rename_dry", single(wrapper, 8 | 4))
    write("safetensors", "bare_file", single(safetensors([("x", "F16", [2, 3])]), 2))
    # sharded: index + two shards
    s1 = safetensors([("model.layers.0.w", "F32", [2, 2]), ("model.layers.0.b", "BF16", [2])])
    s2 = safetensors([("model.layers.1.w", "F32", [2, 2])])
    n1, n2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    index = json.dumps({"metadata": {"total_size": 40},
                        "weight_map": {"model.layers.0.w": n1, "model.layers.0.b": n1, "model.layers.1.w": n2}},
                       indent=2).encode()
    write("safetensors", "sharded_two", bytes([1]) + index + SEP + s1 + SEP + s2)
    write("safetensors", "sharded_missing_tensor",
          bytes([1]) + json.dumps({"weight_map": {"model.layers.0.w": n1, "absent": n1}}).encode() + SEP + s1)
    write("safetensors", "truncated", single(safetensors([("t", "F32", [64])])[:-9]))
    # one real header: the kimi_linear golden's names, dtypes and ranks, every dimension cut to <= 2
    path = os.path.join(ROOT, "tests", "golden", "kimi_linear", "model.safetensors")
    if os.path.exists(path):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            h = json.loads(f.read(n))
        ts = [(k, v["dtype"], [min(d, 2) for d in v["shape"]]) for k, v in sorted(h.items()) if k != "__metadata__"]
        write("safetensors", "golden_kimi_linear_small", single(safetensors(ts, h.get("__metadata__"))))


def safetensors_findings():
    """Shapes whose element count overflows int64 (numel) or whose byte count wraps uint64."""
    def st(h):
        hb = json.dumps(h).encode()
        return bytes([0]) + struct.pack("<Q", len(hb)) + hb + b"\0" * 8
    cases = {
        "numel_overflow_2p62x4": {"w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}},
        "numel_overflow_2p32x2p32x0": {"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 0],
                                             "data_offsets": [0, 0]}},
        "bytes_wrap_i64_2p61": {"w": {"dtype": "I64", "shape": [2305843009213693952], "data_offsets": [0, 0]}},
        "negative_dims_product_1": {"w": {"dtype": "F32", "shape": [18446744073709551615, 18446744073709551615],
                                          "data_offsets": [0, 4]}},
        "empty_f32_null_memcpy": {"z": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}},
    }
    for name, h in cases.items():
        write("safetensors", name, st(h), FINDINGS)


def config_findings():
    base = {"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1}
    big, big2, imin = 9223372036854775807, 4611686018427387904, -9223372036854775808
    cases = {
        "float_int_1e19": {"model_type": "kimi_linear", **base, "vocab_size": 1e19},
        "kimi_moe_shared_mul": {"model_type": "kimi_linear", **base, "layer_types": ["full_attention"],
                                "num_experts": 2, "num_experts_per_token": 1,
                                "moe_intermediate_size": big2, "num_shared_experts": 4},
        "dsv32_moe_shared_mul": {"model_type": "deepseek_v32", **base, "moe_intermediate_size": big,
                                 "n_shared_experts": 2},
        "glm_skip_offset_min": {"model_type": "glm_moe_dsa", **base, "index_skip_topk_offset": imin},
        "mla_head_dim_sum": {"model_type": "deepseek_v32", **base, "qk_nope_head_dim": big, "qk_rope_head_dim": 2},
        "mrope_sum": {"model_type": "qwen3_5_moe_text", **base, "rope_parameters": {"mrope_section": [big, 1]}},
        "mrope_rot_inf": {"model_type": "qwen3_5_moe_text", **base, "head_dim": 10000000000,
                          "partial_rotary_factor": 1e38, "rope_parameters": {"mrope_section": [1]}},
        "gqa_rot_2p63": {"model_type": "qwen3_next", **base, "num_key_value_heads": 1, "head_dim": big,
                         "partial_rotary_factor": 1.0, "layer_types": ["full_attention"]},
        # Fields::strings("layer_types") with no layer_types: const json::operator[] on a missing key
        "glm5_next_text_no_layer_types": {"model_type": "glm5_next_text", **base},
    }
    for name, j in cases.items():
        write("config", name + ".json", json.dumps(j).encode(), FINDINGS)
    seeds = {
        "wrapper_bad_text_type": {"model_type": "qwen3_5_moe", "text_config": {"model_type": 5}},
        "kimi_original_lists": {"model_type": "kimi_linear", **base, "num_hidden_layers": 3,
                                "linear_attn_config": {"kda_layers": [1, 3], "full_attn_layers": [2],
                                                       "num_heads": 2, "head_dim": 4, "gate_lower_bound": -5.0}},
    }
    for name, j in seeds.items():
        write("config", name + ".json", json.dumps(j).encode())


def input_seeds(dayzero):
    if dayzero:
        for name, args in {"make_input_3": ["--docs", "3", "--min-len", "1", "--max-len", "9"],
                           "make_input_20": ["--docs", "20", "--min-len", "1", "--max-len", "30"]}.items():
            out = os.path.join(SEEDS, "input", name + ".h5")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            subprocess.run([dayzero, "make-input", "--out", out, "--vocab", "1000", "--seed", "7", "--overwrite"] + args,
                           check=True, stdout=subprocess.DEVNULL)
    try:
        import h5py
        import numpy as np
    except ImportError:
        print("make_seeds: no h5py/numpy: input/ h5py variants skipped", file=sys.stderr)
        return
    toks = np.array([5, 17, 999, 0, 3, 42, 7, 1, 2, 3, 4], dtype=np.int32)
    offs = np.array([0, 3, 4, 9, 11], dtype=np.int64)

    def h5(name, fn, **kw):
        with tempfile.TemporaryDirectory() as td:
            p = os.path.join(td, "x.h5")
            with h5py.File(p, "w", **kw) as f:
                fn(f)
            with open(p, "rb") as f:
                write("input", name + ".h5", f.read())

    def plain(t=toks, o=offs, **dk):  # no timestamps: the files are the same at every run
        return lambda f: (f.create_dataset("tokens", data=t, track_times=False, **dk),
                          f.create_dataset("offsets", data=o, track_times=False))

    h5("h5py_plain", plain())
    h5("h5py_latest", plain(), libver="latest")
    h5("h5py_chunked_gzip", plain(chunks=(4,), compression="gzip", shuffle=True, fletcher32=True))
    h5("h5py_int16_tokens", plain(t=toks.astype(np.int16)))
    h5("h5py_uint8_tokens_int32_offsets", plain(t=toks.astype(np.uint8), o=offs.astype(np.int32)))
    h5("h5py_bigendian", plain(t=toks.astype(">i4"), o=offs.astype(">i8")))
    h5("h5py_uint64_offsets", plain(o=offs.astype(np.uint64)))
    h5("h5py_int64_tokens_out_of_range", plain(t=np.array([1, 2, 2**40], dtype=np.int64), o=np.array([0, 3])))
    h5("h5py_token_ge_vocab", plain(t=np.array([1, 1000, 2], dtype=np.int32), o=np.array([0, 1, 3])))
    h5("h5py_negative_token", plain(t=np.array([1, -1], dtype=np.int32), o=np.array([0, 2])))
    h5("h5py_offsets_not_monotone", plain(o=np.array([0, 5, 3, 11])))
    h5("h5py_empty_doc", plain(o=np.array([0, 3, 3, 11])))
    h5("h5py_offsets_short", plain(o=np.array([0, 5])))
    h5("h5py_no_offsets", lambda f: f.create_dataset("tokens", data=toks))
    h5("h5py_tokens_2d", plain(t=toks[:10].reshape(2, 5)))
    h5("h5py_tokens_float", plain(t=toks.astype(np.float32)))
    def compact(f):  # compact layout: the data inside the object header
        for name, arr in (("tokens", toks), ("offsets", offs)):
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_layout(h5py.h5d.COMPACT)
            ds = h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(arr.dtype), h5py.h5s.create_simple(arr.shape),
                                 dcpl=dcpl)
            ds.write(h5py.h5s.ALL, h5py.h5s.ALL, arr)
    h5("h5py_compact", compact)
    h5("h5py_group_and_attrs", lambda f: (f.create_group("meta").attrs.create("note", "x"),
                                          f.create_dataset("tokens", data=toks), f.create_dataset("offsets", data=offs),
                                          f.create_dataset("other", data=np.arange(4.0))))
    h5("h5py_softlink", lambda f: (f.create_dataset("data/t", data=toks), f.create_dataset("offsets", data=offs),
                                   f.__setitem__("tokens", h5py.SoftLink("/data/t"))))

    def sparse(f):  # declared 64 chunks, 2 written: the rest reads as the fill value
        d = f.create_dataset("tokens", shape=(256,), dtype=np.int32, chunks=(4,), fillvalue=1)
        d[0:8] = np.arange(8)
        f.create_dataset("offsets", data=np.array([0, 100, 256]))
    h5("h5py_sparse_chunks_fill", sparse)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dayzero", help="the built dayzero binary (make-input seeds)")
    a = ap.parse_args()
    safetensors_seeds()
    safetensors_findings()
    config_findings()
    input_seeds(a.dayzero)


if __name__ == "__main__":
    main()
