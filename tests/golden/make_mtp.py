#!/usr/bin/env python3
"""MTP-layer fixtures for --speculative mtp (docs/speculative.md): random MTP weights beside four
golden models, and the fp64 NumPy MTP logits of their documents (numpy_ref.deepseek_mtp /
qwen3_next_mtp, written from the formulas of docs/families.md, not from any implementation).

transformers drops MTP weights when it loads a checkpoint (no MTP forward), so the reference is
numpy_ref's. Each family's MTP layer is its last MoE layer of the published kind (DeepSeek: MLA +
its own DSA indexer; Qwen: gated GQA) with every weight perturbed (+50 % of its spread in Gaussian
noise), fresh norms and projection. Writes tests/golden/mtp/<family>.safetensors (the MTP tensors
under their published names, DeepSeek's copies of the embedding and head included) and
tests/golden/mtp/mtp_ref.h5: /<family>/{tokens, offsets} (four of the golden's documents) and
/<family>/logits [sum(T - 1), V] (row i of a document: the MTP logits from its token i + 1 and the
model's final hidden state at i). A seed is kept only if the fp64 logits move by < 1e-3 when
1e-6 of Gaussian noise is added to the hidden states (no router or Top-K choice near a tie, where fp32 could differ).
    python3 tests/golden/make_mtp.py
Needs numpy, h5py, safetensors.
"""
import json
import os
import sys

import h5py
import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import numpy_ref  # noqa: E402

FAMILIES = ["deepseek_v32", "glm_moe_dsa", "qwen3_next", "qwen3_5_moe_text", "deepseek_v4"]
PICK = [1, 2, 3, 6]  # golden documents of 2, 7, 33 and 70 tokens (past index_topk 8)


def perturbed(v, rng, norm):
    if norm:
        return v + 0.1 * rng.standard_normal(v.shape)  # (zero-centred or not: around the model's)
    sd = float(v.std()) or 0.01
    return v + 0.5 * sd * rng.standard_normal(v.shape)


def v4_mtp_tensors(cfg, P, rng):
    """DeepSeek-V4: a sliding-window block (the published MTP layer's kind) from layer 0's attention
    and layer 1's routed FFN (layer 0 routes by hash), DeepSeek's own names under mtp.0."""
    D, N = cfg["hidden_size"], cfg["hc_mult"]
    assert cfg["layer_types"][0] == "sliding_attention" and cfg["mlp_layer_types"][1] == "moe"
    out = {}
    for src, parts in (("model.layers.0.", ("attn.", "attn_norm.", "hc_attn_")), ("model.layers.1.", ("ffn.", "ffn_norm.", "hc_ffn_"))):
        for k, v in P.items():
            if k.startswith(src) and k[len(src):].startswith(parts):
                out["mtp.0." + k[len(src):]] = perturbed(v, rng, k.endswith("norm.weight"))
    sd = float(P["model.layers.0.attn.wo_b.weight"].std())
    for n in ("enorm", "hnorm", "norm"):
        out[f"mtp.0.{n}.weight"] = 1.0 + 0.1 * rng.standard_normal(D)
    out["mtp.0.e_proj.weight"] = sd * rng.standard_normal((D, D))
    out["mtp.0.h_proj.weight"] = sd * rng.standard_normal((D, D))
    out["mtp.0.hc_head_fn"] = perturbed(P["model.hc_head.hc_fn"], rng, False)
    out["mtp.0.hc_head_base"] = perturbed(P["model.hc_head.hc_base"], rng, False)
    out["mtp.0.hc_head_scale"] = perturbed(P["model.hc_head.hc_scale"], rng, False)
    out["mtp.0.emb.tok_emb.weight"] = P["model.embed_tokens.weight"].copy()
    out["mtp.0.head.weight"] = P["head.weight"].copy()
    assert out["mtp.0.hc_head_fn"].shape == (N, N * D)
    return {k: v.astype(np.float32) for k, v in out.items()}


def mtp_tensors(cfg, P, rng):
    if cfg["model_type"] == "deepseek_v4":
        return v4_mtp_tensors(cfg, P, rng)
    D = cfg["hidden_size"]
    L = cfg["num_hidden_layers"]
    qwen = cfg["model_type"].startswith("qwen")
    if qwen:
        src = max(i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention")
        dst = "mtp.layers.0."
    else:
        src = max(i for i in range(L) if f"model.layers.{i}.self_attn.indexer.wk.weight" in P
                  and f"model.layers.{i}.mlp.gate.weight" in P)
        dst = f"model.layers.{L}."
    out = {}
    pre = f"model.layers.{src}."
    for k, v in P.items():
        if not k.startswith(pre):
            continue
        n = dst + k[len(pre):]
        if k.endswith("norm.weight") or k.endswith("layernorm.weight"):
            out[n] = v + 0.1 * rng.standard_normal(v.shape)  # (zero-centred or not: around the model's)
        else:
            sd = float(v.std()) or 0.01
            out[n] = v + 0.5 * sd * rng.standard_normal(v.shape)
    one = 0.0 if qwen else 1.0  # zero-centred norms store w - 1
    sd = float(P[pre + "self_attn.o_proj.weight"].std())
    if qwen:
        out["mtp.pre_fc_norm_embedding.weight"] = one + 0.1 * rng.standard_normal(D)
        out["mtp.pre_fc_norm_hidden.weight"] = one + 0.1 * rng.standard_normal(D)
        out["mtp.fc.weight"] = sd * rng.standard_normal((D, 2 * D))
        out["mtp.norm.weight"] = one + 0.1 * rng.standard_normal(D)
    else:
        out[dst + "enorm.weight"] = one + 0.1 * rng.standard_normal(D)
        out[dst + "hnorm.weight"] = one + 0.1 * rng.standard_normal(D)
        out[dst + "eh_proj.weight"] = sd * rng.standard_normal((D, 2 * D))
        out[dst + "shared_head.norm.weight"] = one + 0.1 * rng.standard_normal(D)
        out[dst + "embed_tokens.weight"] = P["model.embed_tokens.weight"].copy()
        out[dst + "shared_head.head.weight"] = P["lm_head.weight"].copy()
    return {k: v.astype(np.float32) for k, v in out.items()}


def mtp_logits(cfg, P, tok, jitter=0.0):
    x, _, _ = numpy_ref.FORWARD[cfg["model_type"]](cfg, P, tok)
    if cfg["model_type"] == "deepseek_v4":  # the streams before the head
        x = x + jitter * np.random.default_rng(5).standard_normal(x.shape)
        return numpy_ref.deepseek_v4_mtp(cfg, P, tok, x)
    centred = cfg["model_type"] in numpy_ref.CENTRED
    xn = numpy_ref.rms(x, P["model.norm.weight"], cfg["rms_norm_eps"], centred)
    xn = xn + jitter * np.random.default_rng(5).standard_normal(xn.shape)
    f = numpy_ref.qwen3_next_mtp if cfg["model_type"].startswith("qwen") else numpy_ref.deepseek_mtp
    return f(cfg, P, tok, xn)


def main():
    os.makedirs(os.path.join(HERE, "mtp"), exist_ok=True)
    with h5py.File(os.path.join(HERE, "mtp", "mtp_ref.h5"), "w") as h:
        for fam in FAMILIES:
            cfg, P = numpy_ref.load(os.path.join(HERE, fam))
            g = h5py.File(os.path.join(HERE, fam, "golden.h5"), "r")
            tokens, go = g["tokens"][:], g["offsets"][:]
            docs = [tokens[go[i]:go[i + 1]] for i in PICK]
            offsets = np.cumsum([0] + [len(d) for d in docs])
            for seed in range(100):
                rng = np.random.default_rng(1000 + seed)
                T = mtp_tensors(cfg, P, rng)
                Q = dict(P)
                Q.update({k: v.astype(np.float64) for k, v in T.items()})
                lg = [mtp_logits(cfg, Q, d) for d in docs]
                moved = max(float(np.abs(mtp_logits(cfg, Q, d, 1e-6) - a).max()) for d, a in zip(docs, lg))
                if moved < 1e-3:
                    break
            print(f"{fam}: seed {1000 + seed}, {len(T)} MTP tensors, logits moved {moved:.2e} under 1e-6 noise,"
                  f" |logits| max {max(float(np.abs(a).max()) for a in lg):.3g}")
            save_file(T, os.path.join(HERE, "mtp", fam + ".safetensors"))
            grp = h.create_group(fam)
            grp["tokens"] = np.concatenate(docs).astype(np.int32)
            grp["offsets"] = offsets.astype(np.int64)
            grp["logits"] = np.concatenate(lg).astype(np.float32)


if __name__ == "__main__":
    main()
