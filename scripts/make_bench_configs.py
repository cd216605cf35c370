"""Writes configs/bench/*.json: the published model shapes of DESIGN section 7 exactly as
../shared/anchors/e2e_transformers.py builds them (transformers' AutoConfig.for_model with the same
keyword arguments), so `dayzero bench e2e` and the transformers + fla anchor run the same model.
Needs transformers (no torch): pip install transformers==5.17.0. Rerun only when the shapes change.
With transformers >= 5.23 it also writes DeepSeek-V4 (its config class's defaults are the released
DeepSeek-V4-Flash shape) cut to its first 8 layers (3 HCA + hash MoE, then CSA / HCA alternating) and
GLM-5 (GlmMoeDsaConfig's defaults) cut to its first 6 layers (3 dense, 3 MoE), and GLM-5.3-Flash
(Glm5NextConfig's defaults) cut to the first 12 / 11 layers (as many as one H200 holds at 8192 / 32768);
and always Kimi K3 cut to 4 layers (no transformers class: the released config's values, by hand,
docs/families.md section 8), 3 KDA + 1 gated MLA, the first layer dense, MXFP4 routed experts.
"""
import json, os, sys
from transformers import AutoConfig

lt = lambda n: [("full_attention" if (i + 1) % 4 == 0 else "linear_attention") for i in range(n)]
kimi = lambda n: dict(vocab_size=163840, hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024,
                      num_hidden_layers=n, num_attention_heads=32, num_key_value_heads=32, kv_lora_rank=512,
                      q_lora_rank=None, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                      num_local_experts=256, num_experts_per_tok=8, n_shared_experts=1, routed_scaling_factor=2.446,
                      layer_types=lt(n), linear_head_dim=128, linear_num_heads=32,
                      mlp_layer_types=["dense"] + ["sparse"] * (n - 1))
qwen = lambda n: dict(vocab_size=151936, hidden_size=2048, num_hidden_layers=n, num_attention_heads=16,
                      num_key_value_heads=2, head_dim=256, num_experts=512, num_experts_per_tok=10,
                      moe_intermediate_size=512, shared_expert_intermediate_size=512, linear_num_key_heads=16,
                      linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                      layer_types=lt(n), partial_rotary_factor=0.25, rope_theta=1e7)
out = sys.argv[1] if len(sys.argv) > 1 else "configs/bench"
for name, mt, kw in (("kimi_linear_48b_a3b_8l", "kimi_linear", kimi(8)),
                     ("kimi_linear_48b_a3b", "kimi_linear", kimi(27)),
                     ("qwen3_next_80b_a3b_8l", "qwen3_next", qwen(8)),
                     ("qwen3_next_80b_a3b", "qwen3_next", qwen(48))):  # whole: TP 2 / 4 / 8 (issue 14)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    AutoConfig.for_model(mt, **kw).to_json_file(os.path.join(d, "config.json"))
    print(d)

# transformers 5.23's config classes, their defaults (the released shapes) cut to the first n layers:
# DeepSeek-V4-Flash (DeepseekV4Config: 3 HCA + hash MoE, then CSA / HCA) to 8; GLM-5 (GlmMoeDsaConfig:
# 78 layers of MLA + DSA, 256 experts, the first 3 dense) to 6, the 3 dense ones and 3 MoE.
import transformers  # noqa: E402
if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (5, 23):
    for name, mt, n, lists in (("deepseek_v4_flash_8l", "deepseek_v4", 8, ("layer_types", "mlp_layer_types")),
                               ("glm5_6l", "glm_moe_dsa", 6, ("mlp_layer_types", "indexer_types"))):
        base = AutoConfig.for_model(mt)
        kw = {k: getattr(base, k)[:n] for k in lists}
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        AutoConfig.for_model(mt, num_hidden_layers=n, num_nextn_predict_layers=0, **kw).to_json_file(
            os.path.join(d, "config.json"))
        print(d)
    # GLM-5.3-Flash (Glm5NextConfig's text defaults: 45 layers, the first 3 dense, KDA x 3 + DSA) cut
    # to as many of its first layers as one H200 holds with dummy bf16 weights (`dayzero plan`,
    # 139.8 GiB): 12 at T = 8192 (132.4 GiB planned), 11 at T = 32768 (130.9; 12 would need 144.7).
    glm = AutoConfig.for_model("glm5_next").text_config
    for n in (12, 11):
        kw = {k: list(getattr(glm, k))[:n] for k in ("layer_types", "mlp_layer_types", "indexer_types")}
        d = os.path.join(out, f"glm5_3_flash_{n}l")
        os.makedirs(d, exist_ok=True)
        AutoConfig.for_model("glm5_next", text_config=dict(num_hidden_layers=n, **kw)).to_json_file(
            os.path.join(d, "config.json"))
        print(d)

# Kimi K3 cut to 4 layers: the released config.json's text values (hidden 7168, 96 heads, q-LoRA 1536,
# 896 experts top-16 of width 3072 in a latent of 3584, 2 shared, dense layer 0 of 33792, SiTU 4 / 25,
# attn_res_block_size 12, MXFP4 routed experts), the wrapper as released.
k3_text = dict(
    model_type="kimi_linear", architectures=["KimiK3ForCausalLM"], vocab_size=163840, hidden_size=7168,
    num_hidden_layers=4, intermediate_size=33792, num_attention_heads=96, num_key_value_heads=96, head_dim=128,
    hidden_act="situ", activation_situ_beta=4.0, activation_situ_linear_beta=25.0, rms_norm_eps=1e-5,
    tie_word_embeddings=False, max_position_embeddings=1048576, rope_theta=10000.0, q_lora_rank=1536,
    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, mla_use_nope=True,
    mla_use_output_gate=True, num_experts=896, num_experts_per_token=16, num_shared_experts=2,
    moe_intermediate_size=3072, moe_renormalize=True, moe_router_activation_func="sigmoid",
    routed_scaling_factor=1.0, first_k_dense_replace=1, moe_layer_freq=1, use_grouped_topk=True,
    num_expert_group=1, topk_group=1, topk_method="noaux_tc", routed_expert_hidden_size=3584,
    latent_moe_use_norm=True, attn_res_block_size=12, num_nextn_predict_layers=0,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
    linear_attn_config=dict(num_heads=96, head_dim=128, short_conv_kernel_size=4, kda_layers=[1, 2, 3],
                            full_attn_layers=[4], use_full_rank_gate=True, gate_lower_bound=-5.0),
    quantization_config=dict(
        quant_method="compressed-tensors", format="mxfp4-pack-quantized", quantization_status="compressed",
        config_groups=dict(group_0=dict(format="mxfp4-pack-quantized", targets=["Linear"], input_activations=None,
                                        weights=dict(num_bits=4, type="float", strategy="group", group_size=32,
                                                     symmetric=True, dynamic=False, scale_dtype="torch.uint8"))),
        ignore=["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"]))
d = os.path.join(out, "kimi_k3_4l")
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(dict(model_type="kimi_k3", architectures=["KimiK3ForConditionalGeneration"], text_config=k3_text,
                   media_placeholder_token_id=163605, pad_token_id=0), f, indent=2)
print(d)
