#!/usr/bin/env python3
"""Build tiny random-initialised models with Hugging Face transformers and dump golden outputs.

One model per family (kimi_linear, deepseek_v32, qwen3_next).  For each family this writes
tests/golden/<family>/{config.json, model.safetensors, golden.h5, NAMES.txt}.
See tests/golden/README.md for the dataset layout and how to regenerate.

Everything is fp32 (TF32 off).  Each document runs alone (batch 1, no padding, positions 0..L-1).
The optional fused kernels (fla, causal_conv1d) are blocked so that transformers takes its
pure-PyTorch reference paths, which are exact fp32 formulations of the modules.
"""
import argparse
import json
import os
import sys

os.environ["USE_HUB_KERNELS"] = "0"
# Force the readable torch reference implementations: a fused Triton kernel (fla) may compute
# in lower precision.  A None entry in sys.modules makes `import fla` raise ImportError.
# --allow-fused keeps them (only to measure how far the fused kernels are from the reference).
if "--allow-fused" not in sys.argv:
    for _blocked in ("fla", "causal_conv1d"):
        sys.modules[_blocked] = None

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")

DOC_LENGTHS = [1, 2, 7, 33, 64, 65, 70, 130]  # 64/65/70/130 straddle the chunk size 64
MODEL_SEEDS = {"kimi_linear": 1234, "deepseek_v32": 2345, "qwen3_next": 3456,
               "qwen3_5_moe_text": 4567, "qwen3_5_moe": 5678, "glm_moe_dsa": 6789, "glm5_next": 7890,
               "deepseek_v4": 8901}
TOKEN_SEED = 777
WEIGHT_STD = 0.15   # initializer_range: the default 0.02 gives near-uniform outputs
LM_HEAD_STD = 0.3   # wider lm_head so log-probs spread over several nats
NORM_NOISE = 0.1    # norm weights are perturbed so that a loader ignoring them is caught
MIN_MARGIN = 3e-5   # smallest accepted gap at any top-k decision (router, indexer)


def kimi_linear_config():
    from transformers import KimiLinearConfig
    cfg = KimiLinearConfig(
        vocab_size=256, hidden_size=64, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        mlp_layer_types=["dense", "sparse", "sparse"],
        kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        linear_num_heads=4, linear_head_dim=16, linear_conv_kernel_dim=4,
        num_local_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
        routed_scaling_factor=2.446, norm_topk_prob=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rms_norm_eps=1e-5, initializer_range=WEIGHT_STD, max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    return cfg, transformers.KimiLinearForCausalLM


def deepseek_v32_config():
    from transformers import DeepseekV32Config
    cfg = DeepseekV32Config(
        vocab_size=256, hidden_size=64, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
        index_n_heads=16, index_head_dim=32, index_topk=8,
        n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0},
        rms_norm_eps=1e-6, initializer_range=WEIGHT_STD,
        pad_token_id=None, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )
    return cfg, transformers.DeepseekV32ForCausalLM


def qwen3_next_config():
    from transformers import Qwen3NextConfig
    cfg = Qwen3NextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=64,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,
        decoder_sparse_step=1, mlp_only_layers=[], num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=32, norm_topk_prob=True,
        rms_norm_eps=1e-6, initializer_range=WEIGHT_STD, max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    return cfg, transformers.Qwen3NextForCausalLM


def qwen3_5_text_kwargs():
    # As qwen3_next above, with Qwen3.5's multimodal RoPE sections over the 8 rotary dims (2+1+1
    # frequencies for t/h/w: text positions make them one RoPE) and no dense/mlp_only options.
    return dict(
        vocab_size=256, hidden_size=64,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        layer_types=["linear_attention", "linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32,
        rms_norm_eps=1e-6, initializer_range=WEIGHT_STD, max_position_embeddings=4096,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )


def qwen3_5_moe_text_config():
    from transformers import Qwen3_5MoeTextConfig
    return Qwen3_5MoeTextConfig(**qwen3_5_text_kwargs()), transformers.Qwen3_5MoeForCausalLM


def qwen3_5_moe_config():
    # The multimodal wrapper with a one-block vision tower (recognised by dayzero, not loaded).
    from transformers import Qwen3_5MoeConfig
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16)
    cfg = Qwen3_5MoeConfig(text_config=qwen3_5_text_kwargs(), vision_config=vision, tie_word_embeddings=False,
                           image_token_id=250, video_token_id=251, vision_start_token_id=252, vision_end_token_id=253)
    return cfg, transformers.Qwen3_5MoeForConditionalGeneration


def glm_moe_dsa_config():
    # GLM-5: deepseek_v32's stack with GLM's defaults (n_group 1), an interleaved-RoPE indexer and
    # indexer_types whose "shared" layers reuse the previous full layer's Top-K.
    from transformers import GlmMoeDsaConfig
    cfg = GlmMoeDsaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
        index_n_heads=16, index_head_dim=32, index_topk=8,
        indexer_types=["full", "shared", "full", "shared"],
        n_routed_experts=8, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-5, initializer_range=WEIGHT_STD,
        pad_token_id=None, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )
    return cfg, transformers.GlmMoeDsaForCausalLM


def glm5_next_config():
    # GLM-5.3-Flash in its multimodal wrapper: KDA (lower-bound gate), MLA without RoPE + the k-pool
    # indexer (groups of 4, top 16 = 4 groups, the incomplete group always kept) with a shared layer,
    # mHC (4 streams), SwiGLU clamp at 1.0 (so it bites at these weights), a 1-block vision tower.
    from transformers import Glm5NextConfig
    text = dict(vocab_size=256, hidden_size=64, intermediate_size=64, moe_intermediate_size=16,
                num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=32,
                qk_rope_head_dim=0, qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
                n_group=1, topk_group=1, routed_scaling_factor=2.5,
                index_n_heads=16, index_head_dim=32, index_topk=16, index_kpool=4, index_kpool_always_select_tail=True,
                linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4, linear_lower_bound=-5.0,
                layer_types=["linear_attention", "indexed_attention", "indexed_attention", "linear_attention",
                             "indexed_attention"],
                mlp_layer_types=["dense", "sparse", "sparse", "sparse", "sparse"],
                indexer_types=["full", "full", "shared", "full", "full"], hc_mult=4, hc_sinkhorn_iters=20,
                swiglu_limit=1.0, pad_token_id=0, rms_norm_eps=1e-5, initializer_range=WEIGHT_STD,
                tie_word_embeddings=False)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64,
                  projection_intermediate_size=32, patch_size=4)
    cfg = Glm5NextConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
    return cfg, transformers.Glm5NextForConditionalGeneration


def deepseek_v4_config():
    # DeepSeek-V4 at toy size: one layer of each attention type (sliding window 8; CSA m = 4 with
    # its indexer picking 4 compressed entries; HCA m' = 16 instead of 128 so that the documents
    # close windows) and a second CSA, hash-routed MoE first then sqrtsoftplus top-2, mHC (4
    # streams), SwiGLU clamp 1.0 (it bites at these weights), grouped output (2 groups of rank 16),
    # YaRN on the compressed layers' RoPE (factor 4 over 64 positions), partial RoPE of 8 dims.
    from transformers import DeepseekV4Config
    cfg = DeepseekV4Config(
        vocab_size=256, hidden_size=64, moe_intermediate_size=16, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, partial_rotary_factor=0.25, q_lora_rank=32,
        num_experts_per_tok=2, n_routed_experts=8, n_shared_experts=1, scoring_func="sqrtsoftplus",
        norm_topk_prob=True, routed_scaling_factor=1.5, max_position_embeddings=256,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                     "compressed_sparse_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
        rope_theta=10000.0, compress_rope_theta=160000.0,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        swiglu_limit=1.0, sliding_window=8, o_groups=2, o_lora_rank=16, index_n_heads=16, index_head_dim=16,
        index_topk=4, num_nextn_predict_layers=0, rms_norm_eps=1e-6, initializer_range=WEIGHT_STD,
        pad_token_id=None, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )
    return cfg, transformers.DeepseekV4ForCausalLM


FAMILIES = {"deepseek_v4": deepseek_v4_config, "kimi_linear": kimi_linear_config, "glm_moe_dsa": glm_moe_dsa_config, "glm5_next": glm5_next_config, "deepseek_v32": deepseek_v32_config,
            "qwen3_next": qwen3_next_config, "qwen3_5_moe_text": qwen3_5_moe_text_config,
            "qwen3_5_moe": qwen3_5_moe_config}


def text_model(model):
    """The decoder stack (wrappers keep it under model.language_model)."""
    inner = model.model
    return getattr(inner, "language_model", inner)


def text_config(cfg):
    return getattr(cfg, "text_config", None) or cfg


@torch.no_grad()
def perturb(model, family, gen):
    """Make the random model less degenerate while keeping the modules' own special inits
    (A_log, dt_bias stay as _init_weights set them)."""
    for name, mod in model.named_modules():
        cls = type(mod).__name__
        if ("RMSNorm" in cls or "LayerNorm" in cls) and getattr(mod, "weight", None) is not None:
            # Qwen3NextRMSNorm is zero-centred (scale 1 + w, init 0); others scale by w (init 1).
            mod.weight.add_(NORM_NOISE * torch.randn(mod.weight.shape, generator=gen))
            if getattr(mod, "bias", None) is not None:
                mod.bias.add_(NORM_NOISE * torch.randn(mod.bias.shape, generator=gen))
        if cls.endswith("HyperConnection"):  # mHC: weights that make pre / post / comb vary per token
            mod.fn.copy_(WEIGHT_STD * torch.randn(mod.fn.shape, generator=gen))
            mod.base.add_(0.3 * torch.randn(mod.base.shape, generator=gen))
            mod.scale.add_(0.3 * torch.randn(mod.scale.shape, generator=gen))
        if hasattr(mod, "index_kpool_compress_ape"):  # k-pool: a pooling softmax that is not uniform
            mod.index_kpool_compress_ape.copy_(torch.randn(mod.index_kpool_compress_ape.shape, generator=gen))
            mod.index_kpool_compress_gate.copy_(0.3 * torch.randn(mod.index_kpool_compress_gate.shape, generator=gen))
        if cls.endswith("HyperHead"):  # DeepSeek-V4's weighted collapse of the streams
            mod.hc_fn.copy_(WEIGHT_STD * torch.randn(mod.hc_fn.shape, generator=gen))
            mod.hc_base.add_(0.3 * torch.randn(mod.hc_base.shape, generator=gen))
            mod.hc_scale.add_(0.3 * torch.randn(mod.hc_scale.shape, generator=gen))
        if hasattr(mod, "sinks"):  # attention sinks: per-head logits that take visible mass
            mod.sinks.copy_(torch.randn(mod.sinks.shape, generator=gen))
        if hasattr(mod, "position_bias"):  # compressor pooling softmax that is not uniform
            mod.position_bias.copy_(torch.randn(mod.position_bias.shape, generator=gen))
        if hasattr(mod, "tid2eid"):  # hash routing: top_k distinct experts per token id
            E, k = mod.num_experts, mod.top_k
            mod.tid2eid.copy_(torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(mod.tid2eid.shape[0])]))
        if hasattr(mod, "e_score_correction_bias"):
            # non-zero selection bias: it must change which experts win but not their weights
            b = mod.e_score_correction_bias
            b.copy_(0.1 * torch.randn(b.shape, generator=gen))
    model.lm_head.weight.copy_(LM_HEAD_STD * torch.randn(model.lm_head.weight.shape, generator=gen))


def make_docs(vocab):
    rng = np.random.default_rng(TOKEN_SEED)
    docs = [rng.integers(3, vocab, size=n).astype(np.int32) for n in DOC_LENGTHS]
    return docs


# ---------------------------------------------------------------- top-k decision margins
class MarginRecorder:
    """Records the smallest gap at each top-k decision so that a reimplementation with
    different fp32 rounding makes the same choices (see MIN_MARGIN)."""

    def __init__(self):
        self.min = {}
        self.topk_sets = {}  # indexer selections per layer, for debugging dumps

    def note(self, key, value):
        self.min[key] = min(self.min.get(key, float("inf")), float(value))


def _kth_gap(scores, k):
    # scores [N, E] with -inf for excluded; gap between k-th and (k+1)-th best, per row
    s = torch.sort(scores, dim=-1, descending=True).values
    if s.shape[-1] <= k:
        return torch.full((s.shape[0],), float("inf"))
    a, b = s[:, k - 1], s[:, k]
    gap = a - b
    gap[torch.isinf(b)] = float("inf")
    return gap


def grouped_router_margins(router, x, rec, key):
    logits = torch.nn.functional.linear(x.reshape(-1, router.hidden_dim).float(), router.weight.float())
    scores = logits.sigmoid()
    choice = scores + router.e_score_correction_bias
    ng, E = router.num_group, router.num_experts
    top2 = choice.view(-1, ng, E // ng).topk(2, dim=-1)[0].sum(-1)  # [N, ng]
    if router.topk_group < ng:
        rec.note(key + ".group", _kth_gap(top2, router.topk_group).min())
    gidx = top2.topk(router.topk_group, dim=-1)[1]
    gmask = torch.zeros_like(top2).scatter_(1, gidx, 1.0)
    emask = gmask.unsqueeze(-1).expand(-1, ng, E // ng).reshape(-1, E).bool()
    masked = choice.masked_fill(~emask, float("-inf"))
    rec.note(key + ".expert", _kth_gap(masked, router.top_k).min())


def softmax_router_margins(router, x, rec, key):
    logits = torch.nn.functional.linear(x.reshape(-1, router.hidden_dim), router.weight)
    probs = torch.softmax(logits.float(), dim=-1)
    rec.note(key + ".expert", _kth_gap(probs, router.top_k).min())


def indexer_margins(idx, hidden, q_resid, cos, sin, rec, key, interleaved=False):
    """Recompute DSA index scores exactly as the module does (fp32) and check the k-th gap."""
    if interleaved:  # GLM-5's indexer
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import \
            apply_rotary_pos_emb_interleave as apply_rotary_pos_emb
    else:
        from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb
    B, S, _ = hidden.shape
    q = idx.wq_b(q_resid).view(B, S, idx.n_heads, idx.head_dim)
    r = idx.qk_rope_head_dim
    k = idx.k_norm(idx.wk(hidden)).unsqueeze(2)
    q_rot, k_rot = apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q[..., r:]], -1)
    k = torch.cat([k_rot, k[..., r:]], -1).squeeze(2)
    sc = torch.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * idx.softmax_scale)
    w = idx.weights_proj(hidden).float() * idx.n_heads ** -0.5
    iscore = torch.matmul(w.unsqueeze(-2), sc).squeeze(-2)[0]  # [S, S]
    causal = torch.ones(S, S, dtype=torch.bool, device=iscore.device).tril()
    iscore = iscore.masked_fill(~causal, float("-inf")).cpu()
    if S > idx.index_topk:
        rec.note(key + ".indexer", _kth_gap(iscore, idx.index_topk).min())
    sel = torch.full((S, idx.index_topk), -1, dtype=torch.int32)
    for s in range(S):
        kk = min(idx.index_topk, s + 1)
        sel[s, :kk] = torch.sort(iscore[s].topk(kk).indices).values.to(torch.int32)
    rec.topk_sets.setdefault(key, []).append(sel.numpy())


@torch.no_grad()
def kpool_margins(idx, hidden, q_resid, out, rec, key):
    """GLM-5.3-Flash's k-pool indexer: recompute the group scores as the module does, note the gap
    at the Kp-th choice, and record the selected token sets (ascending, -1 padded) from its output."""
    B, S, _ = hidden.shape
    q = idx.wq_b(q_resid).view(B, S, -1, idx.head_dim)
    k = idx.k_norm(idx.wk(hidden)).view(B, S, -1, idx.head_dim).squeeze(2)
    g = torch.nn.functional.linear(hidden, idx.index_kpool_compress_gate)
    packed = torch.cat([k, g, torch.ones(B, S, 1)], -1)
    pk, pidx, pvalid = idx.get_pooled_states(packed_states=packed)
    sc = torch.relu(torch.matmul(q.float(), pk.transpose(-1, -2).float().unsqueeze(1)) * idx.softmax_scale)
    w = idx.weights_proj(hidden).float() * idx.n_heads ** -0.5
    isc = torch.matmul(w.unsqueeze(-2), sc).squeeze(-2)[0]  # [S, NP]
    P, Kp = idx.index_kpool, idx.index_topk // idx.index_kpool
    pend = pidx[0, :, -1]
    vis = (pend[None, :] <= torch.arange(S)[:, None]) & pvalid[0][None, :]
    isc = isc.masked_fill(~vis, float("-inf"))
    rows = vis.sum(-1) > Kp
    if rows.any():
        rec.note(key + ".kpool", _kth_gap(isc[rows], Kp).min())
    sel = torch.sort(torch.where(out[0] < 0, torch.full_like(out[0], 1 << 30), out[0]), dim=-1).values
    sel = torch.where(sel == (1 << 30), torch.full_like(sel, -1), sel)
    rec.topk_sets.setdefault(key, []).append(sel.to(torch.int32).numpy())


def v4_router_margins(router, x, rec, key):
    if hasattr(router, "tid2eid"):
        return  # hash routing: no decision
    logits = torch.nn.functional.linear(x.reshape(-1, router.hidden_dim), router.weight)
    scores = torch.sqrt(torch.nn.functional.softplus(logits))
    rec.note(key + ".expert", _kth_gap(scores + router.e_score_correction_bias, router.top_k).min())


def v4_indexer_hooks(idx, rec, key):
    """DeepSeek-V4's indexer over compressed entries: the gap at the Top-K of its masked scores
    (scorer output) and the chosen sets (indexer output: entry ids, -1 padded, made ascending)."""
    m = idx.compress_rate

    def scores_hook(mod, args, out):
        sc = out[0].float()  # [S, NC]
        S, NC = sc.shape
        thr = (torch.arange(S) + 1) // m
        sc = sc.masked_fill(torch.arange(NC)[None, :] >= thr[:, None], float("-inf"))
        rec.note(key + ".indexer", _kth_gap(sc, idx.index_topk).min())

    def out_hook(mod, args, out):
        sel = out[0].clone()
        sel[sel < 0] = 1 << 30
        sel = torch.sort(sel, dim=-1).values
        sel[sel == 1 << 30] = -1
        if sel.shape[-1] < idx.index_topk:  # fewer compressed entries than index_topk: -1 padded
            sel = torch.cat([sel, torch.full((*sel.shape[:-1], idx.index_topk - sel.shape[-1]), -1)], -1)
        rec.topk_sets.setdefault(key, []).append(sel.to(torch.int32).numpy())
    return [idx.scorer.register_forward_hook(scores_hook), idx.register_forward_hook(out_hook)]


def install_margin_hooks(model, family, rec):
    hooks = []
    for li, layer in enumerate(text_model(model).layers):
        mlp = layer.mlp
        gate = getattr(mlp, "gate", None)
        if family == "deepseek_v4":
            hooks.append(gate.register_forward_hook(lambda m, a, o, li=li: v4_router_margins(m, a[0], rec, f"layer{li}")))
            comp = layer.self_attn.compressor
            if comp is not None and hasattr(comp, "indexer"):
                hooks += v4_indexer_hooks(comp.indexer, rec, f"layer{li}")
            continue
        if gate is not None and hasattr(gate, "top_k"):
            fn = grouped_router_margins if hasattr(gate, "num_group") else softmax_router_margins
            hooks.append(gate.register_forward_hook(
                lambda m, a, o, fn=fn, li=li: fn(m, a[0], rec, f"layer{li}")))
        if family == "glm5_next" and hasattr(layer.self_attn, "indexer"):
            idx = layer.self_attn.indexer
            if idx is not None:
                def fwd(m, args, kwargs, out, li=li):
                    kpool_margins(m, kwargs["hidden_states"], kwargs["q_resid"], out, rec, f"layer{li}")
                hooks.append(idx.register_forward_hook(fwd, with_kwargs=True))
        if family in ("deepseek_v32", "glm_moe_dsa"):
            idx = layer.self_attn.indexer
            if idx is None:  # a GLM-5 shared layer: gets its full layer's sets below (shared_topk)
                continue

            def pre(m, args, kwargs, li=li):
                hidden, q_resid, (cos, sin) = args[0], args[1], args[2]
                indexer_margins(m, hidden, q_resid, cos, sin, rec, f"layer{li}", interleaved=family == "glm_moe_dsa")
            hooks.append(idx.register_forward_pre_hook(pre, with_kwargs=True))
    return hooks


# ---------------------------------------------------------------- main work
def build(family, seed):
    cfg, cls = FAMILIES[family]()
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    perturb(model, family, gen)
    model.eval()
    return cfg, model


@torch.no_grad()
def run_docs(model, docs, device, rec=None):
    out = {"lp": [], "hidden": None, "prenorm": [], "last": []}
    captured = {}
    h = text_model(model).layers[-1].register_forward_hook(lambda m, a, o: captured.__setitem__("x", o))
    hidden_acc = None
    for d in docs:
        ids = torch.from_numpy(d.astype(np.int64))[None].to(device)
        res = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        logits = res.logits[0].double()  # [L, V]
        lsm = torch.log_softmax(logits, dim=-1)
        tgt = ids[0, 1:]
        out["lp"].append(lsm[:-1].gather(1, tgt[:, None])[:, 0].float().cpu().numpy())
        out["last"].append(res.logits[0, -1].float().cpu().numpy())
        # mHC models report [T, N, D] streams: rows of N·D
        hs = [t[0].float().cpu().numpy().reshape(len(d), -1) for t in res.hidden_states]
        if hidden_acc is None:
            hidden_acc = [[] for _ in hs]
        for i, t in enumerate(hs):
            hidden_acc[i].append(t)
        x = captured["x"]
        x = x[0] if isinstance(x, tuple) else x
        out["prenorm"].append(x[0].float().cpu().numpy().reshape(len(d), -1))
    h.remove()
    out["hidden"] = [np.concatenate(a, 0) for a in hidden_acc]
    out["prenorm"] = np.concatenate(out["prenorm"], 0)
    return out


def fix_kimi_dense_names(odir, cfg):
    """transformers 5.17 reverts its checkpoint conversion on save and renames every `.mlp.` to
    `.block_sparse_moe.`, dense layers included.  Published Kimi checkpoints keep dense layers
    under `.mlp.` (only MoE layers are `.block_sparse_moe.`), so restore that; the round-trip
    reload below proves transformers still loads the result."""
    from safetensors.torch import load_file, save_file
    path = os.path.join(odir, "model.safetensors")
    sd = load_file(path)
    dense = [i for i, t in enumerate(cfg.mlp_layer_types) if t == "dense"]
    if not any(f"model.layers.{i}.block_sparse_moe." in k for k in sd for i in dense):
        return []  # this transformers release keeps them under mlp. already
    out, renamed = {}, []
    for k, v in sd.items():
        nk = k
        for i in dense:
            pre = f"model.layers.{i}.block_sparse_moe."
            if k.startswith(pre):
                nk = f"model.layers.{i}.mlp." + k[len(pre):]
                renamed.append((k, nk))
        out[nk] = v.contiguous()
    save_file(out, path, metadata={"format": "pt"})
    return renamed


def names_txt(path_st, path_cfg):
    from safetensors import safe_open
    lines = ["# tensors in model.safetensors (name dtype shape), as written by save_pretrained",
             f"# transformers {transformers.__version__}, torch {torch.__version__}"]
    with safe_open(path_st, "pt") as f:
        for k in sorted(f.keys()):
            t = f.get_slice(k)
            lines.append(f"{k} {t.get_dtype()} {list(t.get_shape())}")
    lines.append("")
    lines.append("# config.json as written")
    with open(path_cfg) as f:
        lines.append(f.read().rstrip())
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="kimi_linear,deepseek_v32,qwen3_next")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-seed-tries", type=int, default=40)
    ap.add_argument("--allow-fused", action="store_true", help="do not block fla / causal_conv1d")
    ap.add_argument("--suffix", default="", help="output dir <family><suffix> (e.g. _tf523 for a second release)")
    ap.add_argument("--keep-layout", action="store_true",
                    help="keep the tensor names exactly as this release's save_pretrained writes them")
    args = ap.parse_args()
    device = torch.device(args.device)
    print(f"transformers {transformers.__version__} torch {torch.__version__} device {device}", flush=True)

    for family in args.families.split(","):
        base = MODEL_SEEDS[family]
        for t in range(args.max_seed_tries):
            seed = base + t
            cfg, model = build(family, seed)
            model.to(device)
            docs = make_docs(text_config(cfg).vocab_size)
            rec = MarginRecorder()
            hooks = install_margin_hooks(model, family, rec)
            res = run_docs(model, docs, device, rec)
            for hk in hooks:
                hk.remove()
            worst = min(rec.min.values()) if rec.min else float("inf")
            print(f"{family} seed {seed}: min top-k margin {worst:.3g} {rec.min}", flush=True)
            if worst >= MIN_MARGIN:
                break
        else:
            raise SystemExit(f"{family}: no seed with margins >= {MIN_MARGIN}")

        odir = os.path.join(args.out, family + args.suffix)
        os.makedirs(odir, exist_ok=True)
        model.to("cpu").save_pretrained(odir, safe_serialization=True)
        for extra in ("generation_config.json",):
            p = os.path.join(odir, extra)
            if os.path.exists(p):
                os.remove(p)
        renamed = fix_kimi_dense_names(odir, cfg) if family == "kimi_linear" and not args.keep_layout else []
        for a, b in renamed:
            print(f"{family}: renamed {a} -> {b}")
        model.to(device)

        # Round trip: the saved checkpoint must reproduce the outputs.
        re = type(model).from_pretrained(odir, attn_implementation="eager", dtype=torch.float32).to(device).eval()
        chk = run_docs(re, docs[3:4], device)
        np.testing.assert_allclose(chk["lp"][0], res["lp"][3], rtol=0, atol=1e-5)
        # Device vs CPU cross-check on one document (exercises the CPU path of the same code).
        if device.type != "cpu":
            cpu_res = run_docs(re.to("cpu"), docs[4:5], torch.device("cpu"))
            diff = float(np.abs(cpu_res["lp"][0] - res["lp"][4]).max())
            print(f"{family}: |cpu - {device.type}| max logprob diff {diff:.3g}", flush=True)
        else:
            diff = float("nan")
        del re

        tokens = np.concatenate(docs).astype(np.int32)
        offsets = np.cumsum([0] + [len(d) for d in docs]).astype(np.int64)
        lp = np.concatenate(res["lp"]).astype(np.float32)
        lp_offsets = np.cumsum([0] + [len(d) - 1 for d in docs]).astype(np.int64)
        nl = text_config(cfg).num_hidden_layers
        with h5py.File(os.path.join(odir, "golden.h5"), "w") as f:
            f["tokens"] = tokens
            f["offsets"] = offsets
            f["logprobs"] = lp
            f["lp_offsets"] = lp_offsets
            f["logits_last"] = np.stack(res["last"]).astype(np.float32)
            g = f.create_group("hidden")
            for i, hs in enumerate(res["hidden"]):
                g[f"layer_{i}"] = hs.astype(np.float32)
            g["last_layer_prenorm"] = res["prenorm"].astype(np.float32)
            g.attrs["layout"] = (
                f"layer_0 = embedding output (input of decoder layer 0); layer_i for 1<=i<{nl} = output of "
                f"decoder layer i-1 (residual stream, before any norm); layer_{nl} = final norm applied to the "
                f"output of decoder layer {nl - 1}; last_layer_prenorm = output of decoder layer {nl - 1} "
                "before the final norm. Rows are tokens of all documents concatenated (offsets)."
            )
            tcfg = text_config(cfg)
            lts = getattr(tcfg, "layer_types", None) or []
            shared = [i for i, t in enumerate(getattr(tcfg, "indexer_types", None) or []) if t == "shared"
                      and (not lts or lts[i] != "linear_attention")]
            for i in shared:  # a shared layer attends to the sets of the full layer before it
                src = max(j for j in range(i) if j not in shared)
                rec.topk_sets[f"layer{i}"] = rec.topk_sets[f"layer{src}"]
            if rec.topk_sets:
                d = f.create_group("dsa_topk")
                d.attrs["layout"] = ("per layer [N_tokens, index_topk] int32: key positions (within the "
                                     "document, ascending) chosen by the indexer; -1 pads rows with fewer "
                                     "causal keys than index_topk")
                for k, v in rec.topk_sets.items():
                    d[k] = np.concatenate(v, 0)
            f.attrs["family"] = family
            f.attrs["layout"] = "as save_pretrained wrote it" if (args.keep_layout or not renamed) else \
                "dense Kimi layer renamed back to mlp."
            f.attrs["transformers_version"] = str(transformers.__version__)
            f.attrs["torch_version"] = str(torch.__version__)
            f.attrs["device"] = str(device) + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else "")
            f.attrs["seed"] = seed
            f.attrs["token_seed"] = TOKEN_SEED
            f.attrs["min_topk_margin"] = worst
            f.attrs["cpu_vs_device_max_logprob_diff"] = diff
            f.attrs["notes"] = ("fp32, TF32 off, eager attention, batch 1 per document, positions 0..L-1, "
                                "USE_HUB_KERNELS=0, " + ("fla/causal_conv1d allowed" if args.allow_fused else
                                "fla/causal_conv1d blocked (torch reference paths)"))
        with open(os.path.join(odir, "NAMES.txt"), "w") as f:
            f.write(names_txt(os.path.join(odir, "model.safetensors"), os.path.join(odir, "config.json")))
        print(f"{family}: wrote {odir}; logprob mean {lp.mean():.3f} std {lp.std():.3f} "
              f"min {lp.min():.3f} max {lp.max():.3f}; uniform would be {-np.log(text_config(cfg).vocab_size):.3f}",
              flush=True)


if __name__ == "__main__":
    main()
