#!/usr/bin/env python3
"""Independent float64 NumPy forward pass of the golden models, written from docs/families.md
(not from transformers): token-by-token recurrences, plain softmax attention.

Checks docs/families.md against the committed golden.h5 files and measures how far the fp32
transformers outputs are from an fp64 evaluation.  Needs only numpy, h5py, safetensors.
    python3 tests/golden/numpy_ref.py [family ...]
"""
import json
import math
import os
import sys

import h5py
import numpy as np
from safetensors.numpy import load_file

HERE = os.path.dirname(os.path.abspath(__file__))


def rms(x, w, eps, centred=False):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * ((1.0 + w) if centred else w)


def silu(u):
    return u / (1.0 + np.exp(-u))


def sigmoid(u):
    return 1.0 / (1.0 + np.exp(-u))


def softplus(u):
    return np.where(u > 20.0, u, np.log1p(np.exp(np.minimum(u, 20.0))))


def l2n(x):
    return x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)


def causal_conv_silu(x, w):  # x [T, C], w [C, 1, W]
    T, C = x.shape
    W = w.shape[-1]
    xp = np.concatenate([np.zeros((W - 1, C)), x], 0)
    out = sum(w[:, 0, j][None, :] * xp[j:j + T] for j in range(W))
    return silu(out)


def softmax_attn(q, k, v, scale, allowed):  # q [T,nh,d], k [T,nh,d], v [T,nh,dv], allowed [T,T] or [T,T]
    s = np.einsum("thd,shd->hts", q, k) * scale
    s = np.where(allowed[None], s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v)


def delta_rule(q, k, v, g, beta):
    """q,k [T,Hh,K] (already normed/scaled), v [T,Hh,V], g [T,Hh,K] or [T,Hh,1] log-decay, beta [T,Hh]."""
    T, Hh, K = k.shape
    S = np.zeros((Hh, K, v.shape[-1]))
    out = np.zeros_like(v)
    for t in range(T):
        S = S * np.exp(g[t])[:, :, None]
        kv = np.einsum("hk,hkv->hv", k[t], S)
        delta = beta[t][:, None] * (v[t] - kv)
        S = S + k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hk,hkv->hv", q[t], S)
    return out


def expert(x, gate, up, down, limit=0.0):
    """SwiGLU; limit > 0: the clamp silu(min(g, L)) * clip(u, -L, L) (swiglu_limit)."""
    g, u = x @ gate.T, x @ up.T
    if limit > 0:
        g, u = np.minimum(g, limit), np.clip(u, -limit, limit)
    return (silu(g) * u) @ down.T


def mlp(x, P, pre, limit=0.0):
    return expert(x, P[pre + "gate_proj.weight"], P[pre + "up_proj.weight"], P[pre + "down_proj.weight"], limit)


def kda_mix(cfg, P, a, h, eps, lower_bound=None):
    """KDA token mixer (docs/families.md §1) of normed input h [T, D]; lower_bound: GLM-5.3-Flash's
    gate lower_bound * sigmoid(exp(A_log) * f) instead of -exp(A_log) * softplus(f)."""
    T = h.shape[0]
    Hh, K = cfg["linear_num_heads"], cfg["linear_head_dim"]
    q = causal_conv_silu(h @ P[a + "q_proj.weight"].T, P[a + "q_conv1d.weight"]).reshape(T, Hh, K)
    k = causal_conv_silu(h @ P[a + "k_proj.weight"].T, P[a + "k_conv1d.weight"]).reshape(T, Hh, K)
    v = causal_conv_silu(h @ P[a + "v_proj.weight"].T, P[a + "v_conv1d.weight"]).reshape(T, Hh, K)
    q, k = l2n(q) * K ** -0.5, l2n(k)
    graw = ((h @ P[a + "f_a_proj.weight"].T) @ P[a + "f_b_proj.weight"].T + P[a + "dt_bias"]).reshape(T, Hh, K)
    A = np.exp(P[a + "A_log"].reshape(Hh))[None, :, None]
    g = lower_bound * sigmoid(A * graw) if lower_bound is not None else -A * softplus(graw)
    beta = sigmoid(h @ P[a + "b_proj.weight"].T)
    o = delta_rule(q, k, v, g, beta)
    gate = ((h @ P[a + "g_a_proj.weight"].T) @ P[a + "g_b_proj.weight"].T).reshape(T, Hh, K)
    o = rms(o, P[a + "o_norm.weight"], eps) * sigmoid(gate)
    return o.reshape(T, -1) @ P[a + "o_proj.weight"].T


def sigmoid_router_moe(x, P, pre, E, G, topk_group, top_k, renorm, scale, names, shared_pre, limit=0.0):
    s = sigmoid(x @ P[pre + "gate.weight"].T)
    c = s + P[pre + "gate.e_score_correction_bias"][None]
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        grp = np.array([np.sort(c[t, j * E // G:(j + 1) * E // G])[-2:].sum() for j in range(G)])
        keep = np.argsort(-grp, kind="stable")[:topk_group]
        cm = np.full(E, -np.inf)
        for j in keep:
            cm[j * E // G:(j + 1) * E // G] = c[t, j * E // G:(j + 1) * E // G]
        sel = np.argsort(-cm, kind="stable")[:top_k]
        w = s[t, sel]
        if renorm:
            w = w / (w.sum() + 1e-20)
        w = w * scale
        for e, we in zip(sel, w):
            gname, uname, dname = names(e)
            y[t] += we * expert(x[t:t + 1], P[pre + gname], P[pre + uname], P[pre + dname], limit)[0]
    return y + mlp(x, P, shared_pre, limit)


def rope_neox(x, cos, sin):  # x [T, ..., d]; cos/sin [T, d/2]
    d2 = x.shape[-1] // 2
    c = cos.reshape(cos.shape[0], *([1] * (x.ndim - 2)), d2)
    s = sin.reshape(sin.shape[0], *([1] * (x.ndim - 2)), d2)
    a, b = x[..., :d2], x[..., d2:]
    return np.concatenate([a * c - b * s, b * c + a * s], -1)


def rope_interleaved(x, cos, sin):  # returns interleaved layout (pairs 2i, 2i+1)
    c = cos.reshape(cos.shape[0], *([1] * (x.ndim - 2)), -1)
    s = sin.reshape(sin.shape[0], *([1] * (x.ndim - 2)), -1)
    a, b = x[..., 0::2], x[..., 1::2]
    y = np.empty_like(x)
    y[..., 0::2] = a * c - b * s
    y[..., 1::2] = b * c + a * s
    return y


def yarn(cfg, dim):
    rp = cfg.get("rope_parameters") or dict(cfg.get("rope_scaling") or {}, rope_theta=cfg.get("rope_theta"))
    base = rp["rope_theta"]
    i = np.arange(0, dim, 2) / dim
    inv = 1.0 / base ** i
    att, mscale2 = 1.0, 1.0
    if rp.get("rope_type", rp.get("type", "default")) == "yarn":
        f, L0 = rp["factor"], rp["original_max_position_embeddings"]
        bf, bs = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

        def corr(n):
            return dim * math.log(L0 / (n * 2 * math.pi)) / (2 * math.log(base))
        low, high = max(math.floor(corr(bf)), 0), min(math.ceil(corr(bs)), dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
        inv = inv / f * ramp + inv * (1 - ramp)

        def m(f, s):
            return 1.0 if f <= 1 else 0.1 * s * math.log(f) + 1.0
        ms, msa = rp.get("mscale"), rp.get("mscale_all_dim")
        att = m(f, ms) / m(f, msa) if (ms and msa) else m(f, 1)
        if msa:
            mscale2 = m(f, msa) ** 2
    return inv, att, mscale2


def kimi_forward(cfg, P, tok):
    x = P["model.embed_tokens.weight"][tok]
    eps = cfg["rms_norm_eps"]
    T = len(tok)
    causal = np.tril(np.ones((T, T), bool))
    hs = [x]
    for i, lt in enumerate(cfg["layer_types"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        h = rms(x, P[p + "input_layernorm.weight"], eps)
        if lt == "linear_attention":
            attn = kda_mix(cfg, P, a, h, eps)
        else:
            nh, dn, dr, dv, r = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                                 cfg["v_head_dim"], cfg["kv_lora_rank"])
            if cfg.get("q_lora_rank"):
                q = rms(h @ P[a + "q_a_proj.weight"].T, P[a + "q_a_layernorm.weight"], 1e-6) @ P[a + "q_b_proj.weight"].T
            else:
                q = h @ P[a + "q_proj.weight"].T
            q = q.reshape(T, nh, dn + dr)
            c = h @ P[a + "kv_a_proj_with_mqa.weight"].T
            ckv = rms(c[:, :r], P[a + "kv_a_layernorm.weight"], 1e-6)
            kr = c[:, r:]
            kv = (ckv @ P[a + "kv_b_proj.weight"].T).reshape(T, nh, dn + dv)
            key = np.concatenate([kv[..., :dn], np.broadcast_to(kr[:, None], (T, nh, dr))], -1)
            o = softmax_attn(q, key, kv[..., dn:], (dn + dr) ** -0.5, causal)
            attn = o.reshape(T, -1) @ P[a + "o_proj.weight"].T
        x = x + attn
        h = rms(x, P[p + "post_attention_layernorm.weight"], eps)
        if cfg["mlp_layer_types"][i] == "dense":
            f = mlp(h, P, p + "mlp.")
        else:
            f = sigmoid_router_moe(h, P, p + "block_sparse_moe.", cfg["num_experts"], cfg["num_expert_group"],
                                   cfg["topk_group"], cfg["num_experts_per_token"], cfg["moe_renormalize"],
                                   cfg["routed_scaling_factor"],
                                   lambda e: (f"experts.{e}.w1.weight", f"experts.{e}.w3.weight", f"experts.{e}.w2.weight"),
                                   p + "block_sparse_moe.shared_experts.")
        x = x + f
        hs.append(x)
    return x, hs, None


def indexer_sets(cfg, P, ix, qr, h, cos, sin, irope, causal):
    """DSA index scores and Top-K: (allowed [T, T] bool, sel [T, topk] ascending, -1 padded)."""
    T = h.shape[0]
    nih, dih, topk, dr = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"], cfg["qk_rope_head_dim"]
    iq = (qr @ P[ix + "wq_b.weight"].T).reshape(T, nih, dih)
    ik = h @ P[ix + "wk.weight"].T
    mu, var = ik.mean(-1, keepdims=True), ik.var(-1, keepdims=True)
    ik = (ik - mu) / np.sqrt(var + 1e-6) * P[ix + "k_norm.weight"] + P[ix + "k_norm.bias"]
    iq = np.concatenate([irope(iq[..., :dr], cos, sin), iq[..., dr:]], -1)
    ik = np.concatenate([irope(ik[:, :dr], cos, sin), ik[:, dr:]], -1)
    w = (h @ P[ix + "weights_proj.weight"].T) * nih ** -0.5
    sc = np.maximum(np.einsum("thd,sd->ths", iq, ik) * dih ** -0.5, 0)
    iscore = np.einsum("th,ths->ts", w, sc)
    iscore = np.where(causal, iscore, -np.inf)
    allowed = np.zeros((T, T), bool)
    sel = np.full((T, topk), -1, np.int32)
    for t in range(T):
        kk = min(topk, t + 1)
        chosen = np.sort(np.argsort(-iscore[t], kind="stable")[:kk])
        allowed[t, chosen] = True
        sel[t, :kk] = chosen
    return allowed, sel


def deepseek_rope(cfg, T):
    """cos, sin [T, dr/2] (YaRN attention factor applied) and the softmax scale's mscale^2."""
    inv, att, ms2 = yarn(cfg, cfg["qk_rope_head_dim"])
    ang = np.arange(T)[:, None] * inv[None]
    return np.cos(ang) * att, np.sin(ang) * att, ms2


def deepseek_layer(cfg, P, p, x, rope, sets, dense):
    """One DeepSeek-V3.2 / GLM-5 decoder layer under prefix p over rows x [T, D] at positions 0..T-1.
    sets: None (the layer runs its own indexer) or the (allowed, sel) of the last layer that did.
    Returns (x, (allowed, sel))."""
    eps = cfg["rms_norm_eps"]
    T = x.shape[0]
    causal = np.tril(np.ones((T, T), bool))
    nh, dn, dr, dv, r = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                         cfg["v_head_dim"], cfg["kv_lora_rank"])
    cos, sin, ms2 = rope
    a = p + "self_attn."
    h = rms(x, P[p + "input_layernorm.weight"], eps)
    qr = rms(h @ P[a + "q_a_proj.weight"].T, P[a + "q_a_layernorm.weight"], 1e-6)
    q = (qr @ P[a + "q_b_proj.weight"].T).reshape(T, nh, dn + dr)
    c = h @ P[a + "kv_a_proj_with_mqa.weight"].T
    ckv = rms(c[:, :r], P[a + "kv_a_layernorm.weight"], 1e-6)
    kpe = rope_interleaved(c[:, r:], cos, sin)
    qpe = rope_interleaved(q[..., dn:], cos, sin)
    kv = (ckv @ P[a + "kv_b_proj.weight"].T).reshape(T, nh, dn + dv)
    # indexer (GLM-5: interleaved RoPE)
    glm = cfg["model_type"] == "glm_moe_dsa"
    if sets is None:
        sets = indexer_sets(cfg, P, a + "indexer.", qr, h, cos, sin, rope_interleaved if glm else rope_neox, causal)
    allowed = sets[0]
    qq = np.concatenate([q[..., :dn], qpe], -1)
    kk_ = np.concatenate([kv[..., :dn], np.broadcast_to(kpe[:, None], (T, nh, dr))], -1)
    o = softmax_attn(qq, kk_, kv[..., dn:], (dn + dr) ** -0.5 * ms2, allowed)
    x = x + o.reshape(T, -1) @ P[a + "o_proj.weight"].T
    h = rms(x, P[p + "post_attention_layernorm.weight"], eps)
    if dense:
        f = mlp(h, P, p + "mlp.")
    else:
        f = sigmoid_router_moe(h, P, p + "mlp.", cfg["n_routed_experts"], cfg["n_group"], cfg["topk_group"],
                               cfg["num_experts_per_tok"], cfg["norm_topk_prob"], cfg["routed_scaling_factor"],
                               lambda e: (f"experts.{e}.gate_proj.weight", f"experts.{e}.up_proj.weight",
                                          f"experts.{e}.down_proj.weight"),
                               p + "mlp.shared_experts.")
    return x + f, sets


def deepseek_forward(cfg, P, tok):
    x = P["model.embed_tokens.weight"][tok]
    rope = deepseek_rope(cfg, len(tok))
    hs, sels, sets = [x], [], None
    for i in range(cfg["num_hidden_layers"]):
        # GLM-5's "shared" layers attend to the last full layer's sets
        glm = cfg["model_type"] == "glm_moe_dsa"
        shared = glm and (cfg.get("indexer_types") or ["full"] * (i + 1))[i] == "shared"
        x, sets = deepseek_layer(cfg, P, f"model.layers.{i}.", x, rope, sets if shared else None,
                                 i < cfg["first_k_dense_replace"])
        sels.append(sets[1])
        hs.append(x)
    return x, hs, sels


def mtp_input(P, names, tok, xn, eps, centred, mask_first=False):
    """The MTP layer's input rows i = 0..T-2: [norm(embed(tok[i+1])); norm(xn[i])] projected to D.
    mask_first: the row at position 0 gets a zero embedding (DeepSeek / GLM, as vLLM and SGLang
    serve them)."""
    e_norm, h_norm, proj = names
    e = P["model.embed_tokens.weight"][tok[1:]].copy()
    if mask_first:
        e[0] = 0.0
    cat = np.concatenate([rms(e, P[e_norm], eps, centred), rms(xn[:-1], P[h_norm], eps, centred)], -1)
    return cat @ P[proj].T


def deepseek_mtp(cfg, P, tok, xn):
    """DeepSeek-V3.2 / GLM-5 MTP logits [T-1, V] from the final hidden states xn [T, D] (after the
    final norm): the zero embedding at position 0, the layer model.layers.{L} (its own indexer, MoE)
    and shared_head.norm."""
    p = f"model.layers.{cfg['num_hidden_layers']}."
    eps = cfg["rms_norm_eps"]
    x = mtp_input(P, (p + "enorm.weight", p + "hnorm.weight", p + "eh_proj.weight"), tok, xn, eps, False, True)
    x, _ = deepseek_layer(cfg, P, p, x, deepseek_rope(cfg, len(tok) - 1), None, False)
    return rms(x, P[p + "shared_head.norm.weight"], eps) @ P["lm_head.weight"].T


def qwen3_next_layer(cfg, P, p, lt, x):
    """One Qwen3-Next / Qwen3.5 decoder layer (lt: linear_attention or full_attention) under prefix p
    over rows x [T, D] at positions 0..T-1."""
    eps = cfg["rms_norm_eps"]
    T = x.shape[0]
    causal = np.tril(np.ones((T, T), bool))
    h = rms(x, P[p + "input_layernorm.weight"], eps, centred=True)
    if lt == "linear_attention":
        a = p + "linear_attn."
        nk, nv, dk, dv = (cfg["linear_num_key_heads"], cfg["linear_num_value_heads"],
                          cfg["linear_key_head_dim"], cfg["linear_value_head_dim"])
        rho = nv // nk
        if a + "in_proj_qkv.weight" in P:  # Qwen3.5: separate, [q all | k all | v all]
            mixed = h @ P[a + "in_proj_qkv.weight"].T
            z = (h @ P[a + "in_proj_z.weight"].T).reshape(T, nv, dv)
            b, al = h @ P[a + "in_proj_b.weight"].T, h @ P[a + "in_proj_a.weight"].T
        else:  # Qwen3-Next: fused, grouped per key head
            qkvz = (h @ P[a + "in_proj_qkvz.weight"].T).reshape(T, nk, 2 * dk + 2 * rho * dv)
            ba = (h @ P[a + "in_proj_ba.weight"].T).reshape(T, nk, 2 * rho)
            q, k = qkvz[..., :dk], qkvz[..., dk:2 * dk]
            v = qkvz[..., 2 * dk:2 * dk + rho * dv].reshape(T, nv, dv)
            z = qkvz[..., 2 * dk + rho * dv:].reshape(T, nv, dv)
            b, al = ba[..., :rho].reshape(T, nv), ba[..., rho:].reshape(T, nv)
            mixed = np.concatenate([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], -1)
        mixed = causal_conv_silu(mixed, P[a + "conv1d.weight"])
        Kd = nk * dk
        q = mixed[:, :Kd].reshape(T, nk, dk)
        k = mixed[:, Kd:2 * Kd].reshape(T, nk, dk)
        v = mixed[:, 2 * Kd:].reshape(T, nv, dv)
        beta = sigmoid(b)
        g = -np.exp(P[a + "A_log"])[None] * softplus(al + P[a + "dt_bias"][None])
        q = np.repeat(q, rho, axis=1)
        k = np.repeat(k, rho, axis=1)
        q, k = l2n(q) * dk ** -0.5, l2n(k)
        o = delta_rule(q, k, v, g[..., None], beta)
        o = rms(o, P[a + "norm.weight"], eps) * silu(z)
        attn = o.reshape(T, -1) @ P[a + "out_proj.weight"].T
    else:
        a = p + "self_attn."
        nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        rp = cfg.get("rope_parameters") or {}
        prf = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
        theta = rp.get("rope_theta", cfg.get("rope_theta"))
        rd = int(hd * prf)
        inv = 1.0 / theta ** (np.arange(0, rd, 2) / rd)
        ang = np.arange(T)[:, None] * inv[None]
        cos, sin = np.cos(ang), np.sin(ang)
        qg = (h @ P[a + "q_proj.weight"].T).reshape(T, nh, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(T, -1)
        q = rms(q, P[a + "q_norm.weight"], eps, centred=True)
        k = rms((h @ P[a + "k_proj.weight"].T).reshape(T, nkv, hd), P[a + "k_norm.weight"], eps, centred=True)
        v = (h @ P[a + "v_proj.weight"].T).reshape(T, nkv, hd)
        q = np.concatenate([rope_neox(q[..., :rd], cos, sin), q[..., rd:]], -1)
        k = np.concatenate([rope_neox(k[..., :rd], cos, sin), k[..., rd:]], -1)
        rep = nh // nkv
        o = softmax_attn(q, np.repeat(k, rep, 1), np.repeat(v, rep, 1), hd ** -0.5, causal)
        attn = (o.reshape(T, -1) * sigmoid(gate)) @ P[a + "o_proj.weight"].T
    x = x + attn
    h = rms(x, P[p + "post_attention_layernorm.weight"], eps, centred=True)
    m = p + "mlp."
    E = cfg["num_experts"]
    logits = h @ P[m + "gate.weight"].T
    pr = np.exp(logits - logits.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    f = np.zeros_like(h)
    for t in range(T):
        sel = np.argsort(-pr[t], kind="stable")[:cfg["num_experts_per_tok"]]
        w = pr[t, sel]
        if cfg.get("norm_topk_prob", True):  # Qwen3.5 has no such key: always renormalised
            w = w / w.sum()
        for e, we in zip(sel, w):
            f[t] += we * expert(h[t:t + 1], P[m + f"experts.{e}.gate_proj.weight"],
                                P[m + f"experts.{e}.up_proj.weight"], P[m + f"experts.{e}.down_proj.weight"])[0]
    f += sigmoid(h @ P[m + "shared_expert_gate.weight"].T) * mlp(h, P, m + "shared_expert.")
    assert E == P[m + "gate.weight"].shape[0]
    return x + f


def qwen3_next_forward(cfg, P, tok):
    x = P["model.embed_tokens.weight"][tok]
    hs = [x]
    for i, lt in enumerate(cfg["layer_types"]):
        x = qwen3_next_layer(cfg, P, f"model.layers.{i}.", lt, x)
        hs.append(x)
    return x, hs, None


def qwen3_next_mtp(cfg, P, tok, xn):
    """Qwen3-Next / Qwen3.5 MTP logits [T-1, V] from xn [T, D] (after the final norm): mtp.fc over the
    zero-centred-normed [embedding; hidden], the full-attention layer mtp.layers.0, mtp.norm."""
    eps = cfg["rms_norm_eps"]
    x = mtp_input(P, ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.fc.weight"),
                  tok, xn, eps, True)
    x = qwen3_next_layer(cfg, P, "mtp.layers.0.", "full_attention", x)
    return rms(x, P["mtp.norm.weight"], eps, centred=True) @ P["lm_head.weight"].T


# ---------------------------------------------------------------- DeepSeek-V4
def v4_rope(cfg, kind, pos):
    """cos / sin [len(pos), rd/2] of the 'main' (sliding layers) or 'compress' (CSA / HCA layers,
    their compressors and indexer) RoPE; attention_factor as given (V4 sets 1.0 for YaRN)."""
    rp = cfg["rope_parameters"][kind]
    rd = cfg["qk_rope_head_dim"]
    inv, att, _ = yarn({"rope_parameters": rp}, rd)
    if rp.get("attention_factor") is not None:
        att = rp["attention_factor"]
    ang = np.asarray(pos, np.float64)[:, None] * inv[None]
    return np.cos(ang) * att, np.sin(ang) * att


def rope_tail(x, cos, sin):
    """Interleaved RoPE on the trailing 2 * cos.shape[-1] channels of x [T, ..., d] ([nope | rope])."""
    rd = 2 * cos.shape[-1]
    return np.concatenate([x[..., :-rd], rope_interleaved(x[..., -rd:], cos, sin)], -1)


def unweighted_rms(x, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def hc_pre(X, fn, base, scale, cfg):
    """mHC weights of streams X [T, N, D]: post [T, N], comb [T, N, N] (Sinkhorn), collapsed [T, D]."""
    T, N, D = X.shape
    eps = cfg["hc_eps"]
    mix = unweighted_rms(X.reshape(T, N * D), cfg["rms_norm_eps"]) @ fn.T
    pre = sigmoid(mix[:, :N] * scale[0] + base[:N]) + eps
    post = 2 * sigmoid(mix[:, N:2 * N] * scale[1] + base[N:2 * N])
    c = mix[:, 2 * N:].reshape(T, N, N) * scale[2] + base[2 * N:].reshape(N, N)
    c = np.exp(c - c.max(-1, keepdims=True))
    comb = c / c.sum(-1, keepdims=True) + eps
    comb = comb / (comb.sum(-2, keepdims=True) + eps)
    for _ in range(cfg["hc_sinkhorn_iters"] - 1):
        comb = comb / (comb.sum(-1, keepdims=True) + eps)
        comb = comb / (comb.sum(-2, keepdims=True) + eps)
    return post, comb, (pre[..., None] * X).sum(1)


def hc_post(X, y, post, comb):
    """new stream k = post_k * y + sum_j comb[j, k] X_j."""
    return post[..., None] * y[:, None, :] + np.einsum("tjk,tjd->tkd", comb, X)


def v4_compress(h, P, c, m, D, overlap, cos_of, eps):
    """Compressed entries [T // m, D] of one compressor (prefix c): per closed window of m tokens a
    per-channel softmax over (gate + ape) of its kv, RMSNorm, RoPE at the window's first position.
    overlap (CSA): kv / gate are 2D wide; entry w pools window w-1's first half with window w's
    second half (2m slots; window 0 has only its own)."""
    T = h.shape[0]
    nw = T // m
    kv, g = h @ P[c + "wkv.weight"].T, h @ P[c + "wgate.weight"].T
    ape = P[c + "ape"]
    out = np.zeros((nw, D))
    for w in range(nw):
        r = slice(w * m, w * m + m)
        if overlap:
            vals, gs = [kv[r, D:]], [g[r, D:] + ape[:, D:]]
            if w > 0:
                q = slice((w - 1) * m, w * m)
                vals.insert(0, kv[q, :D])
                gs.insert(0, g[q, :D] + ape[:, :D])
            vals, gs = np.concatenate(vals, 0), np.concatenate(gs, 0)
        else:
            vals, gs = kv[r], g[r] + ape
        e = np.exp(gs - gs.max(0, keepdims=True))
        out[w] = (e / e.sum(0, keepdims=True) * vals).sum(0)
    out = rms(out, P[c + "norm.weight"], eps)
    if nw:
        cos, sin = cos_of(np.arange(nw) * m)
        out = rope_tail(out, cos, sin)
    return out


def routed_sum(h, P, pre, idx, w, names, lim, y):
    """y[t] += Σ_j w[t, j] · expert idx[t, j] (the clamped SwiGLU; names: gate, up, down suffixes)."""
    for t in range(h.shape[0]):
        for j in range(idx.shape[1]):
            e_ = f"{pre}experts.{idx[t, j]}."
            y[t] += w[t, j] * expert(h[t:t + 1], *(P[e_ + n] for n in names), lim)[0]
    return y


def deepseek_v4_layer(cfg, P, p, lt, mlp_type, X, tok, pos):
    """One DeepSeek-V4 block under prefix p (attention kind lt, FFN kind mlp_type) on the streams
    X [T, N, D] at positions pos; returns the new streams and the CSA indexer's sets (None else)."""
    T = X.shape[0]
    N, D, H, eps = cfg["hc_mult"], cfg["head_dim"], cfg["num_attention_heads"], cfg["rms_norm_eps"]
    W, G, rk = cfg["sliding_window"], cfg["o_groups"], cfg["o_lora_rank"]
    Hi, Di, K = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]
    rates = cfg["compress_rates"]
    lim, E, k = cfg["swiglu_limit"], cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    a = p + "attn."
    kind = "main" if lt == "sliding_attention" else "compress"
    cos, sin = v4_rope(cfg, kind, pos)
    post, comb, xc = hc_pre(X, P[p + "hc_attn_fn"], P[p + "hc_attn_base"], P[p + "hc_attn_scale"], cfg)
    h = rms(xc, P[p + "attn_norm.weight"], eps)
    qr = rms(h @ P[a + "wq_a.weight"].T, P[a + "q_norm.weight"], eps)
    q = unweighted_rms((qr @ P[a + "wq_b.weight"].T).reshape(T, H, D), eps)
    q = rope_tail(q, cos, sin)
    kv = rope_tail(rms(h @ P[a + "wkv.weight"].T, P[a + "norm.weight"], eps), cos, sin)  # [T, D]
    # visible[t, j]: raw rows j in the window (t - W, t]; compressed entries appended after them
    vis_raw = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - W)
    comp, vis_c, sel = np.zeros((0, D)), np.zeros((T, 0), bool), None
    cos_c = lambda ps: v4_rope(cfg, "compress", ps)  # noqa: E731
    if lt == "heavily_compressed_attention":
        m = rates[lt]
        comp = v4_compress(h, P, a + "compressor.", m, D, False, cos_c, eps)
        vis_c = np.arange(len(comp))[None, :] < ((pos + 1) // m)[:, None]
    elif lt == "compressed_sparse_attention":
        m = rates[lt]
        comp = v4_compress(h, P, a + "compressor.", m, D, True, cos_c, eps)
        ik = v4_compress(h, P, a + "indexer.compressor.", m, Di, True, cos_c, eps)  # [NC, Di]
        iq = rope_tail((qr @ P[a + "indexer.wq_b.weight"].T).reshape(T, Hi, Di), cos, sin)
        wts = (h @ P[a + "indexer.weights_proj.weight"].T) * Hi ** -0.5
        sc = np.einsum("th,ths->ts", wts, np.maximum(np.einsum("thd,sd->ths", iq, ik), 0) * Di ** -0.5)
        NC = len(comp)
        causal_c = np.arange(NC)[None, :] < ((pos + 1) // m)[:, None]
        vis_c = np.zeros((T, NC), bool)
        sel = np.full((T, K), -1, np.int32)
        for t in range(T):
            cand = np.nonzero(causal_c[t])[0]
            best = np.sort(cand[np.argsort(-sc[t, cand], kind="stable")[:K]])
            vis_c[t, best] = True
            sel[t, :len(best)] = best
    keys = np.concatenate([kv, comp], 0)
    vis = np.concatenate([vis_raw, vis_c], 1)
    s = np.einsum("thd,sd->hts", q, keys) * D ** -0.5
    s = np.where(vis[None], s, -np.inf)
    sink = P[a + "attn_sink"][:, None, None]
    mx = np.maximum(s.max(-1, keepdims=True), sink)
    e = np.exp(s - mx)
    pr = e / (e.sum(-1, keepdims=True) + np.exp(sink - mx))
    o = rope_tail(np.einsum("hts,sd->thd", pr, keys), cos, -sin)  # undo the values' rotation
    og = o.reshape(T, G, H * D // G)
    wa = P[a + "wo_a.weight"].reshape(G, rk, H * D // G)
    y = np.einsum("tgi,gri->tgr", og, wa).reshape(T, G * rk) @ P[a + "wo_b.weight"].T
    X = hc_post(X, y, post, comb)
    post, comb, xc = hc_pre(X, P[p + "hc_ffn_fn"], P[p + "hc_ffn_base"], P[p + "hc_ffn_scale"], cfg)
    h = rms(xc, P[p + "ffn_norm.weight"], eps)
    f = p + "ffn."
    sc = np.sqrt(softplus(h @ P[f + "gate.weight"].T))  # sqrtsoftplus
    if mlp_type == "hash_moe":
        idx = P[f + "gate.tid2eid"][tok].astype(np.int64)
    else:
        idx = np.argsort(-(sc + P[f + "gate.bias"]), -1, kind="stable")[:, :k]
    wsel = np.take_along_axis(sc, idx, -1)
    wsel = wsel / (wsel.sum(-1, keepdims=True) + 1e-20) * cfg["routed_scaling_factor"]
    y = expert(h, P[f + "shared_experts.w1.weight"], P[f + "shared_experts.w3.weight"],
                  P[f + "shared_experts.w2.weight"], lim)
    routed_sum(h, P, f, idx, wsel, ("w1.weight", "w3.weight", "w2.weight"), lim, y)
    X = hc_post(X, y, post, comb)
    return X, sel


def deepseek_v4_forward(cfg, P, tok):
    T = len(tok)
    N = cfg["hc_mult"]
    pos = np.arange(T)
    X = np.repeat(P["model.embed_tokens.weight"][tok][:, None, :], N, 1)  # [T, N, hidden]
    hs, sels = [X.reshape(T, -1)], []
    for i, lt in enumerate(cfg["layer_types"][:cfg["num_hidden_layers"]]):  # (an entry past them: MTP)
        X, sel = deepseek_v4_layer(cfg, P, f"model.layers.{i}.", lt, cfg["mlp_layer_types"][i], X, tok, pos)
        sels.append(sel)
        hs.append(X.reshape(T, -1))
    hs.pop()  # the last layer's output is compared as last_layer_prenorm
    return X, hs, sels


def deepseek_v4_mtp(cfg, P, tok, X):
    """DeepSeek-V4 MTP logits [T-1, V] from the model's streams X [T, N, D] before its head (vLLM's
    deepseek_v4_mtp): e_proj(enorm(embedding of token i+1)), zero at position 0, added to every
    stream of h_proj(hnorm(X_i)); the block mtp.0. (attention kind: layer_types entry
    num_hidden_layers, sliding when absent); its weighted head hc_head_*, norm, the model's head."""
    p, eps, L = "mtp.0.", cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    lts = cfg["layer_types"]
    lt = lts[L] if len(lts) > L else "sliding_attention"
    T = len(tok) - 1
    e = P["model.embed_tokens.weight"][tok[1:]].copy()
    e[0] = 0.0
    E = rms(e, P[p + "enorm.weight"], eps) @ P[p + "e_proj.weight"].T
    Y = rms(X[:-1], P[p + "hnorm.weight"], eps) @ P[p + "h_proj.weight"].T + E[:, None, :]
    Y, _ = deepseek_v4_layer(cfg, P, p, lt, "moe", Y, tok[1:], np.arange(T))
    mix = unweighted_rms(Y.reshape(T, -1), eps) @ P[p + "hc_head_fn"].T
    pre = sigmoid(mix * P[p + "hc_head_scale"][0] + P[p + "hc_head_base"]) + cfg["hc_eps"]
    return rms((pre[..., None] * Y).sum(1), P[p + "norm.weight"], eps) @ P["head.weight"].T


def deepseek_v4_head(cfg, P, X):
    """The weighted collapse of the streams (hc_head), the final norm and the LM head."""
    T, N, D = X.shape
    mix = unweighted_rms(X.reshape(T, N * D), cfg["rms_norm_eps"]) @ P["model.hc_head.hc_fn"].T
    pre = sigmoid(mix * P["model.hc_head.hc_scale"][0] + P["model.hc_head.hc_base"]) + cfg["hc_eps"]
    xn = rms((pre[..., None] * X).sum(1), P["model.norm.weight"], cfg["rms_norm_eps"])
    return xn, xn @ P["head.weight"].T


# ---------------------------------------------------------------- GLM-5.3-Flash (glm5_next)
def glm5_next_forward(cfg, P, tok):
    """docs/families.md §6: KDA with the lower-bound gate, MLA without RoPE on the k-pool indexer's
    tokens (shared layers reuse the previous layer's), mHC streams, clamped SwiGLUs, sigmoid MoE."""
    T = len(tok)
    N, eps, lim = cfg["hc_mult"], cfg["rms_norm_eps"], cfg["swiglu_limit"]
    Pg, Kp = cfg["index_kpool"], cfg["index_topk"] // cfg["index_kpool"]
    Hi, Di = cfg["index_n_heads"], cfg["index_head_dim"]
    tail = cfg.get("index_kpool_always_select_tail", True)
    width = cfg["index_topk"] + (Pg - 1 if tail else 0)
    X = np.repeat(P["model.embed_tokens.weight"][tok][:, None, :], N, 1)
    hs, sels, allowed, sel = [X.reshape(T, -1)], [], None, None
    for i, lt in enumerate(cfg["layer_types"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        post, comb, xc = hc_pre(X, P[p + "hc_attn_fn"], P[p + "hc_attn_base"], P[p + "hc_attn_scale"], cfg)
        h = rms(xc, P[p + "input_layernorm.weight"], eps)
        if lt == "linear_attention":
            y = kda_mix(cfg, P, a, h, eps, cfg.get("linear_lower_bound"))
            sels.append(None)
        else:
            nh, dn, dv, r = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
            qr = rms(h @ P[a + "q_a_proj.weight"].T, P[a + "q_a_layernorm.weight"], eps)
            q = (qr @ P[a + "q_b_proj.weight"].T).reshape(T, nh, dn)
            ckv = rms(h @ P[a + "kv_a_proj_with_mqa.weight"].T, P[a + "kv_a_layernorm.weight"], eps)
            kv = (ckv @ P[a + "kv_b_proj.weight"].T).reshape(T, nh, dn + dv)
            if (cfg.get("indexer_types") or ["full"] * (i + 1))[i] != "shared":
                ix = a + "indexer."
                iq = (qr @ P[ix + "wq_b.weight"].T).reshape(T, Hi, Di)
                ik = h @ P[ix + "wk.weight"].T
                mu, var = ik.mean(-1, keepdims=True), ik.var(-1, keepdims=True)
                ik = (ik - mu) / np.sqrt(var + 1e-6) * P[ix + "k_norm.weight"] + P[ix + "k_norm.bias"]
                gg = h @ P[ix + "index_kpool_compress_gate"].T
                ape = P[ix + "index_kpool_compress_ape"]
                NP = T // Pg
                kp = np.zeros((NP, Di))
                for g_ in range(NP):
                    z = gg[g_ * Pg:(g_ + 1) * Pg] + ape
                    e = np.exp(z - z.max(0, keepdims=True))
                    kp[g_] = (e / e.sum(0, keepdims=True) * ik[g_ * Pg:(g_ + 1) * Pg]).sum(0)
                w = (h @ P[ix + "weights_proj.weight"].T) * Hi ** -0.5
                sc = np.einsum("th,ths->ts", w, np.maximum(np.einsum("thd,sd->ths", iq, kp), 0) * Di ** -0.5)
                allowed = np.zeros((T, T), bool)
                sel = np.full((T, width), -1, np.int32)
                for t in range(T):
                    nvis = (t + 1) // Pg
                    if nvis < Kp:  # fewer groups than Kp visible: every earlier token
                        toks = np.arange(t + 1)
                    else:
                        best = np.sort(np.argsort(-sc[t, :nvis], kind="stable")[:Kp])
                        toks = (best[:, None] * Pg + np.arange(Pg)[None]).reshape(-1)
                        if tail:
                            toks = np.concatenate([toks, np.arange(nvis * Pg, t + 1)])
                    allowed[t, toks] = True
                    sel[t, :len(toks)] = toks
            sels.append(sel)
            o = softmax_attn(q, kv[..., :dn], kv[..., dn:], dn ** -0.5, allowed)
            y = o.reshape(T, -1) @ P[a + "o_proj.weight"].T
        X = hc_post(X, y, post, comb)
        post, comb, xc = hc_pre(X, P[p + "hc_ffn_fn"], P[p + "hc_ffn_base"], P[p + "hc_ffn_scale"], cfg)
        h = rms(xc, P[p + "post_attention_layernorm.weight"], eps)
        m = p + "mlp."
        if cfg["mlp_layer_types"][i] == "dense":
            y = mlp(h, P, m, lim)
        else:
            y = sigmoid_router_moe(h, P, m, cfg["n_routed_experts"], 1, 1, cfg["num_experts_per_tok"],
                                   cfg.get("norm_topk_prob", True), cfg["routed_scaling_factor"],
                                   lambda e: (f"experts.{e}.gate_proj.weight", f"experts.{e}.up_proj.weight",
                                              f"experts.{e}.down_proj.weight"),
                                   m + "shared_experts.", lim)
        X = hc_post(X, y, post, comb)
        hs.append(X.reshape(T, -1))
    hs.pop()
    return X, hs, sels


def glm5_next_head(cfg, P, X):
    """The mean of the streams, the final norm and the LM head."""
    xn = rms(X.mean(1), P["model.norm.weight"], cfg["rms_norm_eps"])
    return xn, xn @ P["lm_head.weight"].T


# ---- Kimi K3 (docs/families.md §8): no transformers class; this forward IS the golden's reference,
# written from the public formulas (pytorch/torchtitan models/kimi_k3, NVIDIA-NeMo/Automodel
# models/kimi_k3). R() is the identity, or (k3_bf16_drift) a round to bf16 after every op, as a bf16
# torch module would: the yardstick for the CUDA backend's bf16 error on this golden.
R = None


def rr(x):
    return x if R is None else R(x)


def bf16_round(x):
    """float64 -> the nearest bf16 (ties to even), returned as float64 (via the fp32 bits)."""
    f = np.asarray(x, np.float32)
    b = f.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def mxfp4_decode(packed, scale):
    """compressed-tensors mxfp4-pack-quantized: packed [R, C/2] (even element in the low nibble),
    scale [R, C/32] E8M0 -> [R, C] float64."""
    nib = np.stack([packed & 15, packed >> 4], -1).reshape(packed.shape[0], -1)
    assert not (scale == 255).any(), "E8M0 NaN scale"
    return E2M1[nib] * np.repeat(np.exp2(scale.astype(np.float64) - 127), 32, axis=1)


def situ_mlp(x, gate, up, down, beta, lbeta):
    """K3's SiTU gated MLP: beta tanh(g/beta) sigmoid(g) * lbeta tanh(u/lbeta) (lbeta None: u)."""
    g, u = rr(x @ gate.T), rr(x @ up.T)
    a = beta * np.tanh(g / beta) * sigmoid(g)
    if lbeta:
        u = lbeta * np.tanh(u / lbeta)
    return rr(rr(a * u) @ down.T)


def attn_res_mix(vals, proj, norm, eps):
    """Block AttnRes: softmax over the values of (norm_w * proj_w) . RMSNorm(v), weighted sum of v."""
    V = np.stack(vals, 0)  # [N, T, D]
    k = V / np.sqrt((V * V).mean(-1, keepdims=True) + eps)
    sc = k @ (norm * proj.reshape(-1))
    p = np.exp(sc - sc.max(0, keepdims=True))
    p /= p.sum(0, keepdims=True)
    return rr((p[..., None] * V).sum(0))


def k3_forward(cfg, P, tok):
    la = cfg["linear_attn_config"]
    Hh, K, eps = la["num_heads"], la["head_dim"], cfg["rms_norm_eps"]
    kda = set(la["kda_layers"])  # 1-indexed
    beta, lbeta = cfg.get("activation_situ_beta", 4.0), cfg.get("activation_situ_linear_beta", 25.0)
    bs = cfg["attn_res_block_size"]
    T = len(tok)
    causal = np.tril(np.ones((T, T), bool))
    x = rr(P["model.embed_tokens.weight"][tok])
    blocks, partial, plain = [], x, x
    hs = [x]

    def lin(h, name):
        return rr(h @ P[name].T)

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        h = attn_res_mix(blocks + [partial], P[p + "self_attention_res_proj.weight"],
                         P[p + "self_attention_res_norm.weight"], eps) if blocks else partial
        if i % bs == 0:
            blocks, partial = blocks + [partial], None
        h = rr(rms(h, P[p + "input_layernorm.weight"], eps))
        if i + 1 in kda:
            q = rr(causal_conv_silu(lin(h, a + "q_proj.weight"), P[a + "q_conv1d.weight"])).reshape(T, Hh, K)
            k = rr(causal_conv_silu(lin(h, a + "k_proj.weight"), P[a + "k_conv1d.weight"])).reshape(T, Hh, K)
            v = rr(causal_conv_silu(lin(h, a + "v_proj.weight"), P[a + "v_conv1d.weight"])).reshape(T, Hh, K)
            q, k = l2n(q) * K ** -0.5, l2n(k)
            f = (lin(lin(h, a + "f_a_proj.weight"), a + "f_b_proj.weight") + P[a + "dt_bias"]).reshape(T, Hh, K)
            A = np.exp(P[a + "A_log"].reshape(-1)[:Hh])[None, :, None]  # the file pads A_log to 128 heads
            g = la["gate_lower_bound"] * sigmoid(A * f)
            bt = sigmoid(lin(h, a + "b_proj.weight"))
            o = rr(delta_rule(q, k, v, g, bt))
            gate = lin(h, a + "g_proj.weight").reshape(T, Hh, K)  # full-rank output gate
            o = rr(rms(o, P[a + "o_norm.weight"], eps) * sigmoid(gate))
            y = lin(o.reshape(T, -1), a + "o_proj.weight")
        else:
            nh, dn, dr, dv, r = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                                 cfg["v_head_dim"], cfg["kv_lora_rank"])
            q = lin(rr(rms(lin(h, a + "q_a_proj.weight"), P[a + "q_a_layernorm.weight"], 1e-6)), a + "q_b_proj.weight")
            q = q.reshape(T, nh, dn + dr)
            c = lin(h, a + "kv_a_proj_with_mqa.weight")
            ckv = rr(rms(c[:, :r], P[a + "kv_a_layernorm.weight"], 1e-6))
            kv = lin(ckv, a + "kv_b_proj.weight").reshape(T, nh, dn + dv)
            key = np.concatenate([kv[..., :dn], np.broadcast_to(c[:, None, r:], (T, nh, dr))], -1)  # NoPE
            o = rr(softmax_attn(q, key, kv[..., dn:], (dn + dr) ** -0.5, causal)).reshape(T, -1)
            o = rr(o * sigmoid(lin(h, a + "g_proj.weight")))  # the output gate
            y = lin(o, a + "o_proj.weight")
        partial = y if partial is None else rr(partial + y)
        plain = plain + y
        h = attn_res_mix(blocks + [partial], P[p + "mlp_res_proj.weight"], P[p + "mlp_res_norm.weight"], eps)
        h = rr(rms(h, P[p + "post_attention_layernorm.weight"], eps))
        if i < cfg["first_k_dense_replace"]:
            m = p + "mlp."
            y = situ_mlp(h, P[m + "gate_proj.weight"], P[m + "up_proj.weight"], P[m + "down_proj.weight"], beta, lbeta)
        else:
            m = p + "block_sparse_moe."
            E, top = cfg["num_experts"], cfg["num_experts_per_token"]
            sc = sigmoid(h @ P[m + "gate.weight"].T)  # the router in fp32 (fp64 here)
            ch = sc + P[m + "gate.e_score_correction_bias"][None]
            xl = lin(h, m + "routed_expert_down_proj.weight")  # the experts' latent input
            u = np.zeros_like(xl)
            for t in range(T):
                sel = np.argsort(-ch[t], kind="stable")[:top]
                w = sc[t, sel]
                if cfg.get("moe_renormalize", True):
                    w = w / (w.sum() + 1e-20)
                w = w * cfg["routed_scaling_factor"]
                for e, we in zip(sel, w):
                    q_ = f"{m}experts.{e}."
                    u[t] += we * situ_mlp(xl[t:t + 1], P[q_ + "w1.weight"], P[q_ + "w3.weight"], P[q_ + "w2.weight"],
                                          beta, lbeta)[0]
            u = rr(u)
            if cfg.get("latent_moe_use_norm", True):
                u = rr(rms(u, P[m + "routed_expert_norm.weight"], eps))
            y = lin(u, m + "routed_expert_up_proj.weight")
            s_ = m + "shared_experts."
            y = rr(y + situ_mlp(h, P[s_ + "gate_proj.weight"], P[s_ + "up_proj.weight"], P[s_ + "down_proj.weight"],
                                beta, lbeta))
        partial = rr(partial + y)
        plain = plain + y
        hs.append(plain)
    hs.pop()
    final = attn_res_mix(blocks + [partial], P["model.output_attn_res_proj.weight"],
                         P["model.output_attn_res_norm.weight"], eps)
    return (plain, final), hs, None


def k3_head(cfg, P, X):
    """The output-site AttnRes mixture (computed by the forward), the final norm, the LM head."""
    plain, final = X
    xn = rr(rms(final, P["model.norm.weight"], cfg["rms_norm_eps"]))
    return xn, xn @ P["lm_head.weight"].T


FORWARD = {"kimi_linear": kimi_forward, "deepseek_v32": deepseek_forward, "glm_moe_dsa": deepseek_forward, "qwen3_next": qwen3_next_forward,
           "qwen3_5_moe_text": qwen3_next_forward}
FORWARD.update(deepseek_v4=deepseek_v4_forward, glm5_next_text=glm5_next_forward, kimi_k3=k3_forward)
HEAD = {"deepseek_v4": deepseek_v4_head, "glm5_next_text": glm5_next_head, "kimi_k3": k3_head}  # default: final RMSNorm, lm_head
CENTRED = {"qwen3_next", "qwen3_5_moe_text"}  # zero-centred RMSNorm (1 + w)


def load(d):
    """config (a wrapper's text_config) and fp64 tensors under plain names (model.language_model.X as
    model.X; the vision tower dropped; a dense Kimi layer saved under block_sparse_moe. as mlp.)."""
    top = json.load(open(os.path.join(d, "config.json")))
    cfg = dict(top.get("text_config") or top)
    if top.get("model_type") == "kimi_k3":  # the K3 wrapper's text model is a kimi_linear config
        cfg["model_type"] = "kimi_k3"
    P, raw = {}, load_file(os.path.join(d, "model.safetensors"))
    for k, v in raw.items():
        if k.startswith(("model.visual.", "vision_tower.", "mm_projector.")) or k.endswith("weight_scale"):
            continue
        if k.endswith(".weight_packed"):  # MXFP4 (compressed-tensors): decoded with its scale
            v, k = mxfp4_decode(v, raw[k[:-len("_packed")] + "_scale"]), k[:-len("_packed")]
        k = k.replace("model.language_model.", "model.", 1)
        if k.startswith("language_model."):  # K3's text model: language_model.model.* / language_model.lm_head.*
            k = k[len("language_model."):]
        P[k] = v.astype(np.float64)
    if cfg["model_type"] == "kimi_linear":
        for i, t in enumerate(cfg.get("mlp_layer_types", [])):
            if t == "dense":
                for n in ("gate_proj", "up_proj", "down_proj"):
                    old = f"model.layers.{i}.block_sparse_moe.{n}.weight"
                    if old in P:
                        P[f"model.layers.{i}.mlp.{n}.weight"] = P.pop(old)
    return cfg, P


def check(dirname):
    d = os.path.join(HERE, dirname)
    cfg, P = load(d)
    family = cfg["model_type"]
    f = h5py.File(os.path.join(d, "golden.h5"), "r")
    tokens, offsets = f["tokens"][:], f["offsets"][:]
    L = cfg["num_hidden_layers"]
    lps, hid, pre, sels = [], [[] for _ in range(L + 1)], [], []
    for i in range(len(offsets) - 1):
        tok = tokens[offsets[i]:offsets[i + 1]]
        x, hs, sel = FORWARD[family](cfg, P, tok)
        if family in HEAD:
            xn, logits = HEAD[family](cfg, P, x)
            x = (x[0] if isinstance(x, tuple) else x).reshape(len(tok), -1)
        else:
            xn = rms(x, P["model.norm.weight"], cfg["rms_norm_eps"], centred=(family in CENTRED))
            logits = xn @ P["lm_head.weight"].T
        m = logits.max(-1, keepdims=True)
        lsm = logits - m - np.log(np.exp(logits - m).sum(-1, keepdims=True))
        lps.append(lsm[np.arange(len(tok) - 1), tok[1:]])
        for j in range(L):
            hid[j].append(hs[j])
        hid[L].append(xn)
        pre.append(x)
        if sel is not None:
            sels.append(sel)
    lp = np.concatenate(lps)
    res = {"logprobs": float(np.abs(lp - f["logprobs"][:]).max())}
    for j in range(L + 1):
        res[f"layer_{j}"] = float(np.abs(np.concatenate(hid[j]) - f[f"hidden/layer_{j}"][:]).max())
    res["last_layer_prenorm"] = float(np.abs(np.concatenate(pre) - f["hidden/last_layer_prenorm"][:]).max())
    if sels:
        for li in range(L):
            if sels[0][li] is None:
                continue
            mine = np.concatenate([s[li] for s in sels])
            res[f"dsa_topk_mismatch_layer{li}"] = int((mine != f[f"dsa_topk/layer{li}"][:]).sum())
    print(dirname, "fp64 numpy vs golden (max abs):", " ".join(f"{k}={v:.3g}" for k, v in res.items()))
    return res


# --check: fail unless every golden's log-probs are within LP_TOL of the fp64 forward and every
# DSA Top-K set is the same. fp32 transformers sits at ~1-2e-5 from fp64 here, the chunked GDN of
# the Qwen families at ~1-2.4e-4 (reassociation); a wrong formula moves log-probs by >= 1e-2
# (sliding window +1: 5.4 nats, index_topk +1: 3.5, no sinks: 4.4 on DeepSeek-V4's last document).
LP_TOL = 5e-4
NO_FP64_FORWARD = set()  # model_types with a golden but no float64 forward here (none today)

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--check"]
    strict = "--check" in sys.argv[1:]
    fams = args or sorted(n for n in os.listdir(HERE) if os.path.exists(os.path.join(HERE, n, "golden.h5")))
    bad = []
    for fam in fams:
        family = json.load(open(os.path.join(HERE, fam, "config.json")))
        family = (family.get("text_config") or family)["model_type"]
        if family in NO_FP64_FORWARD:
            print(fam, f"({family}): no fp64 forward yet, not checked")
            continue
        res = check(fam)
        if res["logprobs"] > LP_TOL or any(v for k, v in res.items() if k.startswith("dsa_topk_mismatch")):
            bad.append(fam)
    if strict and bad:
        sys.exit(f"numpy_ref: {', '.join(bad)} differ from the fp64 forward beyond {LP_TOL} or in a Top-K set")
