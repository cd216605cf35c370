"""Writes configs/bench/*.json: the published model shapes of DESIGN section 7 exactly as
../shared/anchors/e2e_transformers.py builds them (transformers' AutoConfig.for_model with the same
keyword arguments), so `dayzero bench e2e` and the transformers + fla anchor run the same model.
Needs transformers (no torch): pip install transformers==5.17.0. Rerun only when the shapes change.
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
                     ("qwen3_next_80b_a3b_8l", "qwen3_next", qwen(8))):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    AutoConfig.for_model(mt, **kw).to_json_file(os.path.join(d, "config.json"))
    print(d)
