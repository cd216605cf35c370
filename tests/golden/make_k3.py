#!/usr/bin/env python3
"""The Kimi K3 golden (tests/golden/kimi_k3): a tiny random K3 checkpoint in the published layout and
its per-token log-probs from the fp64 NumPy forward of numpy_ref.py (k3_forward).

transformers has no Kimi K3 class, so the reference is numpy_ref's forward, written from the public
formulas (pytorch/torchtitan torchtitan/models/kimi_k3, NVIDIA-NeMo/Automodel models/kimi_k3;
docs/families.md §8). What the checkpoint holds, as the release packages it:
  - config.json: model_type kimi_k3 (KimiK3ForConditionalGeneration) with a text_config of type
    kimi_linear (Moonshot's linear_attn_config with 1-indexed kda_layers / full_attn_layers,
    use_full_rank_gate, gate_lower_bound), hidden_act situ, routed_expert_hidden_size (latent MoE),
    mla_use_output_gate, attn_res_block_size, and the compressed-tensors quantization_config of the
    release (mxfp4-pack-quantized, group 32, routed experts only: its ignore list), plus a
    vision_config;
  - model.safetensors: language_model.model.* / language_model.lm_head.weight, a 2-tensor vision
    tower (vision_tower.*, mm_projector.*), routed experts as experts.{e}.w{1,2,3}.weight_packed (U8,
    two E2M1 per byte, even element low) + weight_scale (U8 E8M0 per 32), A_log zero-padded to 128;
  - golden.h5: as make_golden.py writes it (tests/golden/README.md), from the fp64 forward, plus
    /hidden/* where layer_i is the plain sum embedding + every sub-layer output so far (an AttnRes
    model has no single residual stream; dayzero reports the same sum), layer_L the final norm of the
    output-site AttnRes mixture;
and the bf16 yardstick of the CUDA backend (k3 in bf16_drift.json): the same forward with every op's
output rounded to bf16 (numpy_ref.R), mean / max |log-prob - fp64|.

    python3 tests/golden/make_k3.py [--out DIR]
Needs numpy, h5py, safetensors (no torch).
"""
import argparse
import json
import os
import sys

import h5py
import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import numpy_ref  # noqa: E402

DOC_LENGTHS = [1, 2, 7, 33, 64, 65, 70, 130]  # as make_golden.py
TOKEN_SEED = 777
SEED = 9012
WEIGHT_STD, LM_HEAD_STD, NORM_NOISE = 0.15, 0.3, 0.1
MIN_MARGIN = 3e-5

V, D, L_LAYERS, H, K = 256, 64, 6, 4, 16
LATENT, I_MOE, I_DENSE, E, TOP = 32, 128, 96, 8, 2


def text_config():
    kda = [1, 2, 3, 5]  # 1-indexed, Moonshot's convention; 4 and 6 are full attention (K3 ends on one)
    return {
        "model_type": "kimi_linear", "architectures": ["KimiK3ForCausalLM"],
        "vocab_size": V, "hidden_size": D, "num_hidden_layers": L_LAYERS, "intermediate_size": I_DENSE,
        "num_attention_heads": H, "num_key_value_heads": H, "head_dim": D // H,
        "hidden_act": "situ", "activation_situ_beta": 1.5, "activation_situ_linear_beta": 2.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
        "max_position_embeddings": 1048576, "rope_theta": 10000.0,
        "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "mla_use_nope": True, "mla_use_output_gate": True,
        "num_experts": E, "num_experts_per_token": TOP, "num_shared_experts": 2, "moe_intermediate_size": I_MOE,
        "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.0,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "use_grouped_topk": True, "num_expert_group": 1,
        "topk_group": 1, "topk_method": "noaux_tc",
        "routed_expert_hidden_size": LATENT, "latent_moe_use_norm": True,
        "attn_res_block_size": 2, "num_nextn_predict_layers": 0,
        "linear_attn_config": {"num_heads": H, "head_dim": K, "short_conv_kernel_size": 4, "kda_layers": kda,
                               "full_attn_layers": [i for i in range(1, L_LAYERS + 1) if i not in kda],
                               "use_full_rank_gate": True, "gate_lower_bound": -5.0},
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "format": "mxfp4-pack-quantized", "targets": ["Linear"], "input_activations": None,
                "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32,
                            "symmetric": True, "dynamic": False, "observer": "minmax", "scale_dtype": "torch.uint8"}}},
            "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                       "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*",
                       "re:.*routed_expert_(down|up)_proj.*", "re:.*block_sparse_moe\\.gate.*"]},
    }


def config():
    return {"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"],
            "media_placeholder_token_id": 250, "pad_token_id": 0,
            "text_config": text_config(),
            "vision_config": {"model_type": "kimi_k3_vision", "vt_hidden_size": 8, "vt_num_hidden_layers": 1,
                              "vt_num_attention_heads": 2, "vt_intermediate_size": 16, "patch_size": 14,
                              "merge_kernel_size": [2, 2], "text_hidden_size": D}}


def mxfp4_encode(w):
    """[R, C] -> packed [R, C/2], scale [R, C/32]: OCP MX (scale exponent floor(log2 amax) - 2, the
    E2M1 emax), elements rounded to the nearest code (ties to the lower magnitude index)."""
    R, C = w.shape
    g = w.reshape(R, C // 32, 32)
    amax = np.abs(g).max(-1)
    e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1))) - 2, -127).clip(-127, 127)
    q = g / np.exp2(e)[..., None]
    mags = numpy_ref.E2M1[:8]
    code = np.abs(np.abs(q)[..., None] - mags).argmin(-1).astype(np.uint8)
    code |= (np.signbit(q) & (code > 0)).astype(np.uint8) << 3
    code = code.reshape(R, C)
    return (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8), (e + 127).astype(np.uint8).reshape(R, C // 32)


def weights(seed):
    rng = np.random.default_rng(seed)
    T = {}

    def n(name, *shape, std=WEIGHT_STD):
        T[name] = (rng.standard_normal(shape) * std).astype(np.float32)

    def norm(name, dim):
        T[name] = (1 + NORM_NOISE * rng.standard_normal(dim)).astype(np.float32)

    p0 = "language_model.model."
    n(p0 + "embed_tokens.weight", V, D, std=1.0)
    norm(p0 + "norm.weight", D)
    n("language_model.lm_head.weight", V, D, std=LM_HEAD_STD)
    n(p0 + "output_attn_res_proj.weight", 1, D)
    norm(p0 + "output_attn_res_norm.weight", D)
    kda = set(text_config()["linear_attn_config"]["kda_layers"])
    for i in range(L_LAYERS):
        p = f"{p0}layers.{i}."
        for s in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            norm(p + s + ".weight", D)
        n(p + "self_attention_res_proj.weight", 1, D)
        n(p + "mlp_res_proj.weight", 1, D)
        a = p + "self_attn."
        if i + 1 in kda:
            for x in ("q", "k", "v"):
                n(a + f"{x}_proj.weight", H * K, D)
                T[a + f"{x}_conv1d.weight"] = rng.uniform(-0.5, 0.5, (H * K, 1, 4)).astype(np.float32)
            A = np.zeros(128, np.float32)  # K3 stores A_log zero-padded to a multiple of 128 heads
            A[:H] = np.log(rng.uniform(1, 16, H))
            T[a + "A_log"] = A
            T[a + "dt_bias"] = rng.uniform(-1, 1, H * K).astype(np.float32)
            n(a + "f_a_proj.weight", K, D)
            n(a + "f_b_proj.weight", H * K, K)
            n(a + "b_proj.weight", H, D)
            n(a + "g_proj.weight", H * K, D)  # full-rank output gate
            norm(a + "o_norm.weight", K)
            n(a + "o_proj.weight", D, H * K)
        else:
            n(a + "q_a_proj.weight", 32, D)
            norm(a + "q_a_layernorm.weight", 32)
            n(a + "q_b_proj.weight", H * 24, 32)
            n(a + "kv_a_proj_with_mqa.weight", 32 + 8, D)
            norm(a + "kv_a_layernorm.weight", 32)
            n(a + "kv_b_proj.weight", H * 32, 32)
            n(a + "g_proj.weight", H * 16, D)  # MLA output gate
            n(a + "o_proj.weight", D, H * 16)
        if i == 0:
            m = p + "mlp."
            n(m + "gate_proj.weight", I_DENSE, D)
            n(m + "up_proj.weight", I_DENSE, D)
            n(m + "down_proj.weight", D, I_DENSE)
        else:
            m = p + "block_sparse_moe."
            n(m + "gate.weight", E, D)
            T[m + "gate.e_score_correction_bias"] = (0.1 * rng.standard_normal(E)).astype(np.float32)
            n(m + "routed_expert_down_proj.weight", LATENT, D)
            n(m + "routed_expert_up_proj.weight", D, LATENT)
            norm(m + "routed_expert_norm.weight", LATENT)
            for x in ("gate", "up"):
                n(m + f"shared_experts.{x}_proj.weight", 2 * I_MOE, D)
            n(m + "shared_experts.down_proj.weight", D, 2 * I_MOE)
            for e in range(E):
                for w, shape in (("w1", (I_MOE, LATENT)), ("w3", (I_MOE, LATENT)), ("w2", (LATENT, I_MOE))):
                    pk, sc = mxfp4_encode(rng.standard_normal(shape) * WEIGHT_STD * 2)
                    T[m + f"experts.{e}.{w}.weight_packed"] = pk
                    T[m + f"experts.{e}.{w}.weight_scale"] = sc
    # the vision tower and projector: recognised by name, never loaded
    n("vision_tower.patch_embed.proj.weight", 8, 3 * 14 * 14)
    n("mm_projector.proj.0.weight", D, 32)
    return T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(HERE, "kimi_k3"))
    ap.add_argument("--drift-json", default=os.path.join(HERE, "bf16_drift.json"))
    args = ap.parse_args()
    rng = np.random.default_rng(TOKEN_SEED)
    docs = [rng.integers(3, V, size=n).astype(np.int32) for n in DOC_LENGTHS]
    os.makedirs(args.out, exist_ok=True)
    cfg_json = config()

    for seed in range(SEED, SEED + 40):
        T = weights(seed)
        save_file(T, os.path.join(args.out, "model.safetensors"))
        with open(os.path.join(args.out, "config.json"), "w") as f:
            json.dump(cfg_json, f, indent=2)
        cfg, P = numpy_ref.load(args.out)
        # router margins: every routed token's top_k-th selection score vs the next one
        worst = np.inf
        real_sigmoid = numpy_ref.sigmoid
        logits = []

        def rec(u):
            if u.ndim == 2 and u.shape[1] == E:
                logits.append(u.copy())
            return real_sigmoid(u)
        numpy_ref.sigmoid = rec
        res = []
        try:
            for d in docs:
                res.append(numpy_ref.k3_forward(cfg, P, d))
        finally:
            numpy_ref.sigmoid = real_sigmoid
        # the routers' logits in layer order per document: layers 1..L-1 (layer 0 is dense)
        per_doc = L_LAYERS - 1
        for j, lg in enumerate(logits):
            layer = 1 + j % per_doc
            bias = P[f"model.layers.{layer}.block_sparse_moe.gate.e_score_correction_bias"]
            c = np.sort(real_sigmoid(lg) + bias[None], -1)[:, ::-1]
            worst = min(worst, float((c[:, TOP - 1] - c[:, TOP]).min()))
        print(f"seed {seed}: min router margin {worst:.3g}", flush=True)
        if worst >= MIN_MARGIN:
            break
    else:
        raise SystemExit("no seed with router margins >= MIN_MARGIN")

    lps, hid, pre, last = [], [[] for _ in range(L_LAYERS + 1)], [], []
    for d, ((plain, final), hs, _) in zip(docs, res):
        xn, lg = numpy_ref.k3_head(cfg, P, (plain, final))
        m = lg.max(-1, keepdims=True)
        lsm = lg - m - np.log(np.exp(lg - m).sum(-1, keepdims=True))
        lps.append(lsm[np.arange(len(d) - 1), d[1:]])
        last.append(lg[-1])
        for j in range(L_LAYERS):
            hid[j].append(hs[j])
        hid[L_LAYERS].append(xn)
        pre.append(plain)
    lp = np.concatenate(lps)

    # mutations that the golden must notice (how far each moves the log-probs, nats)
    def lp_of(c2, P2):
        out = []
        for d in docs[-1:]:
            (pl, fi), _, _ = numpy_ref.k3_forward(c2, P2, d)
            _, lg = numpy_ref.k3_head(c2, P2, (pl, fi))
            m = lg.max(-1, keepdims=True)
            lsm = lg - m - np.log(np.exp(lg - m).sum(-1, keepdims=True))
            out.append(lsm[np.arange(len(d) - 1), d[1:]])
        return np.concatenate(out)
    base = lp_of(cfg, P)
    muts = {}
    for name, change in (("situ_beta 4", {"activation_situ_beta": 4.0}), ("linear_beta null", {"activation_situ_linear_beta": None}),
                         ("no latent norm", {"latent_moe_use_norm": False}), ("block size 3", {"attn_res_block_size": 3})):
        c2 = dict(cfg)
        c2.update(change)
        muts[name] = float(np.abs(lp_of(c2, P) - base).max())
    P2 = dict(P)
    for i in range(L_LAYERS):
        if f"model.layers.{i}.self_attn.g_proj.weight" in P2 and (i + 1) not in cfg["linear_attn_config"]["kda_layers"]:
            P2[f"model.layers.{i}.self_attn.g_proj.weight"] = P2[f"model.layers.{i}.self_attn.g_proj.weight"] * 0 + 20
    muts["no MLA output gate"] = float(np.abs(lp_of(cfg, P2) - base).max())
    print("mutations (max |dlogprob| on the longest document):", muts)

    # the bf16 yardstick
    numpy_ref.R = numpy_ref.bf16_round
    Pb = {k: numpy_ref.bf16_round(v) for k, v in P.items()}
    lpb = []
    for d in docs:
        (pl, fi), _, _ = numpy_ref.k3_forward(cfg, Pb, d)
        _, lg = numpy_ref.k3_head(cfg, Pb, (pl, fi))
        m = lg.max(-1, keepdims=True)
        lsm = lg - m - np.log(np.exp(lg - m).sum(-1, keepdims=True))
        lpb.append(lsm[np.arange(len(d) - 1), d[1:]])
    numpy_ref.R = None
    drift = np.abs(np.concatenate(lpb) - lp)
    print(f"bf16-emulated drift: mean {drift.mean():.4f} max {drift.max():.4f} over {len(drift)}")

    tokens = np.concatenate(docs).astype(np.int32)
    with h5py.File(os.path.join(args.out, "golden.h5"), "w") as f:
        f["tokens"] = tokens
        f["offsets"] = np.cumsum([0] + [len(d) for d in docs]).astype(np.int64)
        f["logprobs"] = lp.astype(np.float32)
        f["lp_offsets"] = np.cumsum([0] + [len(d) - 1 for d in docs]).astype(np.int64)
        f["logits_last"] = np.stack(last).astype(np.float32)
        g = f.create_group("hidden")
        for i in range(L_LAYERS + 1):
            g[f"layer_{i}"] = np.concatenate(hid[i]).astype(np.float32)
        g["last_layer_prenorm"] = np.concatenate(pre).astype(np.float32)
        g.attrs["layout"] = ("layer_0 = embedding; layer_i (1 <= i < L) = embedding + the outputs of every sub-layer "
                             "of decoder layers 0..i-1 (the plain sum: an AttnRes model has no single residual "
                             f"stream); layer_{L_LAYERS} = final norm of the output-site AttnRes mixture; "
                             "last_layer_prenorm = the plain sum after the last layer")
        f.attrs["family"] = "kimi_k3"
        f.attrs["reference"] = "tests/golden/numpy_ref.py k3_forward, float64 (no transformers class for Kimi K3)"
        f.attrs["seed"] = seed
        f.attrs["token_seed"] = TOKEN_SEED
        f.attrs["min_router_margin"] = worst
        f.attrs["mutations"] = json.dumps(muts)
    from safetensors import safe_open
    lines = ["# tensors in model.safetensors (name dtype shape), written by tests/golden/make_k3.py"]
    with safe_open(os.path.join(args.out, "model.safetensors"), "np") as f:
        for k in sorted(f.keys()):
            t = f.get_slice(k)
            lines.append(f"{k} {t.get_dtype()} {list(t.get_shape())}")
    lines += ["", "# config.json as written", json.dumps(cfg_json, indent=2)]
    with open(os.path.join(args.out, "NAMES.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")

    if args.drift_json:
        dj = json.load(open(args.drift_json)) if os.path.exists(args.drift_json) else {}
        dj["kimi_k3"] = {"n": int(len(drift)), "mean_abs": float(drift.mean()), "max_abs": float(drift.max()),
                         "how": "no transformers class: tests/golden/make_k3.py, the fp64 NumPy forward with every "
                                "op's output and every weight rounded to bf16 (numpy_ref.R = bf16_round), against "
                                "the same forward in fp64"}
        with open(args.drift_json, "w") as f:
            json.dump(dj, f, indent=1)
    print(f"kimi_k3: wrote {args.out}; logprob mean {lp.mean():.3f} std {lp.std():.3f}; seed {seed}")


if __name__ == "__main__":
    main()
