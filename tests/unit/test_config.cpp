// config.json normalisation: one small realistic config per family, written inline, checked against
// per-layer lists and values written out by hand; error cases with their messages.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include "config/model_config.hpp"
#include "error_of.hpp"
#include "core/error.hpp"

using namespace dz;
using json = nlohmann::json;

namespace {

using dz::test::error_of;

// Parses J through from_file so messages carry the file name; returns the message or "<no error>".
std::string file_error(const json& j, std::string* path_out = nullptr) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("dz_config_" + std::to_string(::getpid()) + ".json")).string();
  {
    std::ofstream f(path);
    f << j.dump(1);
  }
  if (path_out) *path_out = path;
  std::string e = error_of([&] { ModelConfig::from_file(path); });
  std::remove(path.c_str());
  return e;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct L {  // expected layer: mixer, ffn, indexer
  MixerKind m;
  FfnKind f;
  bool idx;
};
void check_layers(const ModelConfig& c, const std::vector<L>& want) {
  REQUIRE(c.layers.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("layer " << i);
    CHECK(c.layers[i].mixer == want[i].m);
    CHECK(c.layers[i].ffn == want[i].f);
    CHECK(c.layers[i].has_indexer == want[i].idx);
  }
}

const auto KDA = MixerKind::KDA, MLA = MixerKind::MLA, GDN = MixerKind::GDN, GQA = MixerKind::GQA;
const auto D = FfnKind::Dense, M = FfnKind::MoE;

// Kimi Linear as transformers saves it (attribute_map names: num_experts, moe_renormalize, ...).
json kimi_transformers() {
  return json::parse(R"({
    "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
    "vocab_size": 97, "hidden_size": 24, "num_hidden_layers": 5, "rms_norm_eps": 1e-5,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": false,
    "hidden_act": "silu", "intermediate_size": 48,
    "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention"],
    "mlp_layer_types": ["dense", "sparse", "sparse", "sparse", "sparse"],
    "linear_num_heads": 2, "linear_head_dim": 16, "linear_conv_kernel_dim": 4,
    "num_attention_heads": 3, "num_key_value_heads": 3, "q_lora_rank": null, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
    "num_experts": 7, "num_experts_per_token": 2, "num_shared_experts": 1, "moe_intermediate_size": 12,
    "moe_renormalize": true, "routed_scaling_factor": 2.446, "num_expert_group": 1, "topk_group": 1
  })");
}

// The same model in Moonshot's original layout (1-indexed layer lists, first_k_dense_replace).
json kimi_original() {
  return json::parse(R"({
    "model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"],
    "vocab_size": 97, "hidden_size": 24, "num_hidden_layers": 5, "rms_norm_eps": 1e-5,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": false,
    "hidden_act": "silu", "intermediate_size": 48,
    "linear_attn_config": {"num_heads": 2, "head_dim": 16, "short_conv_kernel_size": 4,
                           "kda_layers": [1, 2, 4], "full_attn_layers": [3, 5]},
    "num_attention_heads": 3, "num_key_value_heads": 3, "q_lora_rank": null, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "mla_use_nope": true,
    "num_experts": 7, "num_experts_per_token": 2, "num_shared_experts": 1, "moe_intermediate_size": 12,
    "moe_renormalize": true, "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.446,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "use_grouped_topk": true,
    "num_expert_group": 1, "topk_group": 1
  })");
}

json deepseek() {
  return json::parse(R"({
    "model_type": "deepseek_v32", "vocab_size": 131, "hidden_size": 32, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16,
    "qk_nope_head_dim": 8, "qk_rope_head_dim": 6, "v_head_dim": 8,
    "rope_theta": 10000, "max_position_embeddings": 163840,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "index_n_heads": 4, "index_head_dim": 16, "index_topk": 5,
    "intermediate_size": 64, "moe_intermediate_size": 12, "n_routed_experts": 8, "n_shared_experts": 1,
    "num_experts_per_tok": 3, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
    "norm_topk_prob": true, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "rms_norm_eps": 1e-6,
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false
  })");
}

json qwen() {
  return json::parse(R"({
    "model_type": "qwen3_next", "vocab_size": 151, "hidden_size": 32, "num_hidden_layers": 5,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 24, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
    "partial_rotary_factor": 0.25, "rope_theta": 10000000.0,
    "intermediate_size": 40, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 12,
    "shared_expert_intermediate_size": 20, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "mlp_only_layers": [0], "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "eos_token_id": 150
  })");
}

json dayzero() {
  return json::parse(R"({
    "model_type": "dayzero_hybrid", "vocab_size": 101, "hidden_size": 32, "num_hidden_layers": 5,
    "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    "linear_attn_config": {"num_heads": 2, "head_dim": 16, "short_conv_kernel_size": 4,
                           "gate": "lower_bound_sigmoid", "lower_bound": -4.0,
                           "kda_layers": [1, 2, 4], "full_attn_layers": [3, 5]},
    "num_attention_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8, "v_head_dim": 8, "mla_use_output_gate": true, "rope_theta": 50000.0,
    "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4,
    "intermediate_size": 64, "first_k_dense_replace": 1, "num_experts": 4, "num_experts_per_token": 2,
    "num_shared_experts": 1, "moe_intermediate_size": 16, "moe_renormalize": true,
    "moe_router_activation_func": "sigmoid", "use_grouped_topk": true, "num_expert_group": 2,
    "topk_group": 1, "routed_scaling_factor": 2.0, "attn_res_block_size": 2
  })");
}

}  // namespace

TEST_CASE("config: to_string names", "[unit]") {
  CHECK(std::string(to_string(Family::KimiLinear)) == "kimi_linear");
  CHECK(std::string(to_string(Family::Dayzero)) == "dayzero_hybrid");
  CHECK(std::string(to_string(MixerKind::GDN)) == "GDN");
  CHECK(std::string(to_string(FfnKind::MoE)) == "moe");
}

TEST_CASE("config: kimi_linear transformers layout", "[unit]") {
  ModelConfig c = ModelConfig::from_json(kimi_transformers());
  CHECK(c.family == Family::KimiLinear);
  check_layers(c, {{KDA, D, false}, {KDA, M, false}, {MLA, M, false}, {KDA, M, false}, {MLA, M, false}});
  CHECK(c.vocab_size == 97);
  CHECK(c.hidden_size == 24);
  CHECK(c.num_layers == 5);
  CHECK(c.rms_norm_eps == 1e-5f);
  CHECK((c.bos_token_id == 1 && c.eos_token_id == 2 && c.pad_token_id == 0));
  CHECK((c.la_num_k_heads == 2 && c.la_num_v_heads == 2 && c.la_head_k_dim == 16 && c.la_head_v_dim == 16));
  CHECK(c.la_conv_kernel == 4);
  CHECK(c.kda_gate == KdaGate::Softplus);
  CHECK((c.num_heads == 3 && c.q_lora_rank == 0 && c.kv_lora_rank == 16));
  CHECK((c.qk_nope_head_dim == 8 && c.qk_rope_head_dim == 4 && c.v_head_dim == 8));
  CHECK(!c.mla_output_gate);
  CHECK(c.intermediate_size == 48);
  CHECK((c.n_routed_experts == 7 && c.num_experts_per_tok == 2 && c.moe_intermediate_size == 12));
  CHECK((c.n_shared_experts == 1 && c.shared_intermediate_size == 12));
  CHECK(c.score_func == ScoreFunc::Sigmoid);
  CHECK(c.router_correction_bias);
  CHECK(c.norm_topk_prob);
  CHECK(c.routed_scaling_factor == 2.446f);
  CHECK((c.n_group == 1 && c.topk_group == 1));
  CHECK(c.attn_res_block_size == 0);
  CHECK(!c.norm_zero_centered);
  CHECK(c.index_topk == 0);
}

TEST_CASE("config: kimi_linear original and transformers layouts normalise identically", "[unit]") {
  ModelConfig a = ModelConfig::from_json(kimi_transformers());
  ModelConfig b = ModelConfig::from_json(kimi_original());
  CHECK(a.to_json() == b.to_json());
  check_layers(b, {{KDA, D, false}, {KDA, M, false}, {MLA, M, false}, {KDA, M, false}, {MLA, M, false}});

  // transformers' aliases (norm_topk_prob, n_group, num_experts_per_tok, n_shared_experts) also work
  json t = kimi_transformers();
  t.erase("moe_renormalize"), t.erase("num_expert_group"), t.erase("num_experts_per_token"), t.erase("num_shared_experts");
  t["norm_topk_prob"] = true, t["n_group"] = 1, t["num_experts_per_tok"] = 2, t["n_shared_experts"] = 1;
  CHECK(ModelConfig::from_json(t).to_json() == a.to_json());

  // Both layout descriptions at once must agree.
  json both = kimi_original();
  both["layer_types"] = kimi_transformers()["layer_types"];
  CHECK(ModelConfig::from_json(both).to_json() == a.to_json());
  both["layer_types"][0] = "full_attention";
  CHECK(contains(error_of([&] { ModelConfig::from_json(both); }), "disagrees"));
}

TEST_CASE("config: kimi_linear K3 fields and moe_layer_freq", "[unit]") {
  json j = kimi_original();
  j["linear_attn_config"]["gate_lower_bound"] = -5.0;
  j["attn_res_block_size"] = 2;
  j["mla_use_output_gate"] = true;
  j["dense_ffn_hidden"] = 40;  // replaces intermediate_size for the dense layers
  j["moe_layer_freq"] = 2;     // MoE at layers >= 1 with i % 2 == 0: 2 and 4
  ModelConfig c = ModelConfig::from_json(j);
  check_layers(c, {{KDA, D, false}, {KDA, D, false}, {MLA, M, false}, {KDA, D, false}, {MLA, M, false}});
  CHECK(c.kda_gate == KdaGate::LowerBoundSigmoid);
  CHECK(c.kda_gate_lower_bound == -5.f);
  CHECK(c.attn_res_block_size == 2);
  CHECK(c.mla_output_gate);
  CHECK(c.intermediate_size == 40);

  // Without mlp_layer_types the transformers layout uses first_k_dense_replace (default 1).
  json t = kimi_transformers();
  t.erase("mlp_layer_types");
  t["first_k_dense_replace"] = 2;
  check_layers(ModelConfig::from_json(t),
               {{KDA, D, false}, {KDA, D, false}, {MLA, M, false}, {KDA, M, false}, {MLA, M, false}});
}

#ifdef DZ_SOURCE_DIR
// Kimi K3 (tests/golden/kimi_k3, the published packaging): the kimi_k3 wrapper's text_config of type
// kimi_linear with SiTU, the latent MoE, the full-rank KDA gate and the compressed-tensors MXFP4
// quantization_config.
TEST_CASE("config: kimi_k3 wrapper (SiTU, latent MoE, full-rank gate, MXFP4 metadata)", "[unit]") {
  const std::string g = std::string(DZ_SOURCE_DIR) + "/tests/golden/kimi_k3/config.json";
  std::ifstream in(g);
  const json j = json::parse(in);
  ModelConfig c = ModelConfig::from_json(j);
  CHECK((c.family == Family::KimiLinear && c.model_type == "kimi_linear" && c.wrapper_model_type == "kimi_k3"));
  CHECK(c.has_vision);
  check_layers(c, {{KDA, D, false}, {KDA, M, false}, {KDA, M, false}, {MLA, M, false}, {KDA, M, false}, {MLA, M, false}});
  CHECK((c.hidden_act == "situ" && c.situ_beta == 1.5f && c.situ_linear_beta == 2.f));
  CHECK((c.moe_latent_size == 32 && c.moe_latent_norm && c.kda_full_rank_gate && c.weights_mxfp4));
  CHECK((c.kda_gate == KdaGate::LowerBoundSigmoid && c.kda_gate_lower_bound == -5.f && c.mla_output_gate));
  CHECK((c.q_lora_rank == 32 && c.attn_res_block_size == 2 && c.n_shared_experts == 2 && c.routed_scaling_factor == 2.f));
  // the published defaults: betas 4 / 25 when absent; linear_beta null leaves the up branch unbounded
  json d = j;
  d["text_config"].erase("activation_situ_beta");
  d["text_config"].erase("activation_situ_linear_beta");
  ModelConfig cd = ModelConfig::from_json(d);
  CHECK((cd.situ_beta == 4.f && cd.situ_linear_beta == 25.f));
  d["text_config"]["activation_situ_linear_beta"] = nullptr;
  CHECK(ModelConfig::from_json(d).situ_linear_beta == 0.f);
  // quantization_config beside text_config (the wrapper's) reaches the text model too
  json w = j;
  w["quantization_config"] = w["text_config"]["quantization_config"];
  w["text_config"].erase("quantization_config");
  CHECK(ModelConfig::from_json(w).weights_mxfp4);
  // the full-rank gate at the top level of the text config is the same switch
  json f = j;
  f["text_config"]["linear_attn_config"].erase("use_full_rank_gate");
  CHECK(!ModelConfig::from_json(f).kda_full_rank_gate);
  f["text_config"]["use_full_rank_gate"] = true;
  CHECK(ModelConfig::from_json(f).kda_full_rank_gate);
  // a kimi_k3 wrapper must wrap a kimi_linear text model
  json bad = j;
  bad["text_config"]["model_type"] = "qwen3_next";
  CHECK(contains(error_of([&] { ModelConfig::from_json(bad); }), "kimi_k3 wraps kimi_linear"));
}
#endif

TEST_CASE("config: deepseek_v32", "[unit]") {
  ModelConfig c = ModelConfig::from_json(deepseek());
  CHECK(c.family == Family::DeepseekV32);
  check_layers(c, {{MLA, D, true}, {MLA, M, true}, {MLA, M, true}, {MLA, M, true}});
  CHECK((c.num_heads == 4 && c.q_lora_rank == 24 && c.kv_lora_rank == 16));
  CHECK((c.qk_nope_head_dim == 8 && c.qk_rope_head_dim == 6 && c.v_head_dim == 8));
  CHECK((c.index_n_heads == 4 && c.index_head_dim == 16 && c.index_topk == 5));
  CHECK(c.rope.style == RopeStyle::Interleaved);
  CHECK(c.rope.theta == 10000.f);
  CHECK(c.rope.yarn);
  CHECK(c.rope.yarn_factor == 40.f);
  CHECK(c.rope.yarn_original_max_pos == 4096);
  CHECK((c.rope.yarn_beta_fast == 32.f && c.rope.yarn_beta_slow == 1.f));
  CHECK((c.rope.yarn_mscale == 1.f && c.rope.yarn_mscale_all_dim == 1.f));
  CHECK((c.n_routed_experts == 8 && c.num_experts_per_tok == 3 && c.moe_intermediate_size == 12));
  CHECK((c.n_shared_experts == 1 && c.shared_intermediate_size == 12));
  CHECK((c.n_group == 4 && c.topk_group == 2));
  CHECK(c.score_func == ScoreFunc::Sigmoid);
  CHECK(c.router_correction_bias);
  CHECK(c.routed_scaling_factor == 2.5f);
  CHECK(c.intermediate_size == 64);
  CHECK(c.rms_norm_eps == 1e-6f);
  CHECK(c.pad_token_id == -1);

  // transformers v5 spelling of the same RoPE: rope_parameters with rope_type.
  json v5 = deepseek();
  v5.erase("rope_scaling"), v5.erase("rope_theta");
  v5["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 40.0},
                           {"original_max_position_embeddings", 4096}, {"beta_fast", 32}, {"beta_slow", 1},
                           {"mscale", 1.0}, {"mscale_all_dim", 1.0}};
  CHECK(ModelConfig::from_json(v5).to_json() == c.to_json());

  json nl = deepseek();
  nl["rope_interleave"] = false;
  CHECK(ModelConfig::from_json(nl).rope.style == RopeStyle::NeoX);

  // layer_types as transformers 5.17 (deepseek_sparse_attention) and 5.23 (indexed_attention) save them
  for (const char* name : {"deepseek_sparse_attention", "indexed_attention"}) {
    json lt = deepseek();
    lt["layer_types"] = json::array({name, name, name, name});
    CHECK(ModelConfig::from_json(lt).to_json() == c.to_json());
  }
  json bad = deepseek();
  bad["layer_types"] = json::array({"linear_attention", "indexed_attention", "indexed_attention", "indexed_attention"});
  CHECK_THROWS_WITH(ModelConfig::from_json(bad), Catch::Contains("linear_attention"));
}

TEST_CASE("config: qwen3_next", "[unit]") {
  ModelConfig c = ModelConfig::from_json(qwen());
  CHECK(c.family == Family::Qwen3Next);
  // full_attention_interval 4: layer 3 (0-indexed) is full attention; mlp_only_layers [0] dense.
  check_layers(c, {{GDN, D, false}, {GDN, M, false}, {GDN, M, false}, {GQA, M, false}, {GDN, M, false}});
  CHECK((c.la_num_k_heads == 2 && c.la_num_v_heads == 4 && c.la_head_k_dim == 16 && c.la_head_v_dim == 24));
  CHECK((c.num_heads == 4 && c.num_kv_heads == 2 && c.head_dim == 16));
  CHECK(c.norm_zero_centered);
  CHECK(c.attn_output_gate);
  CHECK(c.shared_expert_gate);
  CHECK((c.n_shared_experts == 1 && c.shared_intermediate_size == 20));
  CHECK(c.score_func == ScoreFunc::Softmax);
  CHECK(!c.router_correction_bias);
  CHECK(c.rope.style == RopeStyle::NeoX);
  CHECK(c.rope.partial_rotary_factor == 0.25f);
  CHECK(c.rope.theta == 1e7f);
  CHECK(!c.rope.yarn);
  CHECK((c.eos_token_id == 150 && c.bos_token_id == -1));

  // Explicit layer_types and v5 rope_parameters give the same description.
  json j = qwen();
  j.erase("full_attention_interval"), j.erase("partial_rotary_factor"), j.erase("rope_theta");
  j["layer_types"] = {"linear_attention", "linear_attention", "linear_attention", "full_attention",
                      "linear_attention"};
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25}};
  CHECK(ModelConfig::from_json(j).to_json() == c.to_json());

  json s = qwen();
  s["decoder_sparse_step"] = 2;  // MoE where (i + 1) % 2 == 0 and i not in mlp_only_layers
  check_layers(ModelConfig::from_json(s),
               {{GDN, D, false}, {GDN, M, false}, {GDN, D, false}, {GQA, M, false}, {GDN, D, false}});
}

TEST_CASE("config: dayzero_hybrid", "[unit]") {
  ModelConfig c = ModelConfig::from_json(dayzero());
  CHECK(c.family == Family::Dayzero);
  check_layers(c, {{KDA, D, false}, {KDA, M, false}, {MLA, M, true}, {KDA, M, false}, {MLA, M, true}});
  CHECK(c.kda_gate == KdaGate::LowerBoundSigmoid);
  CHECK(c.kda_gate_lower_bound == -4.f);
  CHECK(c.attn_res_block_size == 2);
  CHECK(c.mla_output_gate);
  CHECK((c.index_n_heads == 2 && c.index_head_dim == 16 && c.index_topk == 4));
  CHECK((c.n_group == 2 && c.topk_group == 1 && c.routed_scaling_factor == 2.f));
  CHECK(c.rope.theta == 50000.f);

  json j = dayzero();
  j["index_topk"] = 0;  // no indexer: dense MLA
  check_layers(ModelConfig::from_json(j),
               {{KDA, D, false}, {KDA, M, false}, {MLA, M, false}, {KDA, M, false}, {MLA, M, false}});
  j = dayzero();
  j["linear_attn_config"]["gate"] = "softplus";
  CHECK(ModelConfig::from_json(j).kda_gate == KdaGate::Softplus);

  json n = ModelConfig::from_json(dayzero()).to_json();
  CHECK(n["layers"][2] == json({{"mixer", "MLA"}, {"ffn", "moe"}, {"indexer", true}}));
  CHECK(n["linear_attention"]["gate"] == "lower_bound_sigmoid");
  CHECK(n["attn_res_block_size"] == 2);

#ifdef DZ_SOURCE_DIR
  // The presets shipped in configs/ must load.
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(DZ_SOURCE_DIR) / "configs";
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".json") {
        std::ifstream in(e.path());
        json p = json::parse(in);
        if (p.value("model_type", "") != "dayzero_hybrid") continue;  // run configs live there too
        INFO(e.path().string());
        CHECK_NOTHROW(ModelConfig::from_file(e.path().string()));
      }
#endif
}

TEST_CASE("config: errors name the field and the file", "[unit]") {
  std::string path;
  json j = kimi_original();
  j["model_type"] = "llama";
  std::string e = file_error(j, &path);
  CHECK(contains(e, path));
  CHECK(contains(e, "model_type 'llama' is not supported"));
  CHECK(!contains(e, "\n"));

  j = deepseek();
  j.erase("hidden_size");
  e = file_error(j, &path);
  CHECK(e == path + ": field hidden_size is missing");

  j = kimi_original();
  j["linear_attn_config"]["kda_layers"] = {1, 2, 4, 9};
  CHECK(contains(file_error(j), "field kda_layers has layer 9, outside 1..5"));

  j = kimi_original();
  j["linear_attn_config"]["kda_layers"] = {1, 2};  // layer 4 neither kind
  CHECK(contains(file_error(j), "leave layer 4 (1-indexed) neither KDA nor full attention"));

  j = kimi_original();
  j["linear_attn_config"]["full_attn_layers"] = {2, 3, 5};  // 2 twice
  CHECK(contains(file_error(j), "layer 2 is listed twice"));

  j = kimi_transformers();
  j["layer_types"] = {"linear_attention", "full_attention"};
  CHECK(contains(file_error(j), "field layer_types has 2 entries for 5 layers"));

  j = kimi_transformers();
  j["layer_types"][1] = "mamba";
  CHECK(contains(file_error(j), "field layer_types entry 1 is 'mamba'"));

  j = qwen();
  j["num_attention_heads"] = 5;
  CHECK(contains(file_error(j), "field num_attention_heads 5 is not a multiple of num_key_value_heads 2"));

  j = qwen();
  j["linear_num_value_heads"] = 3;
  CHECK(contains(file_error(j), "field linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2"));

  j = deepseek();
  j["n_group"] = 3;
  CHECK(contains(file_error(j), "field n_group 3 does not divide the 8 routed experts"));

  j = dayzero();
  j["linear_attn_config"]["gate"] = "exp";
  CHECK(contains(file_error(j), "field gate is 'exp'"));

  j = dayzero();
  j.erase("index_n_heads");
  CHECK(contains(file_error(j), "field index_n_heads is missing"));

  j = dayzero();
  j.erase("linear_attn_config");
  CHECK(contains(file_error(j), "field linear_attn_config is missing"));

  j = kimi_transformers();
  j["hidden_act"] = "gelu";
  CHECK(contains(file_error(j), "field hidden_act 'gelu' is not supported"));
  j = qwen();  // SiTU is Kimi K3's: its betas are parsed by the Kimi family only
  j["hidden_act"] = "situ";
  CHECK(contains(file_error(j), "field hidden_act 'situ' is not supported"));
  j = kimi_transformers();
  j["hidden_act"] = "situ";
  j["activation_situ_beta"] = -1.0;
  CHECK(contains(file_error(j), "field activation_situ_beta must be positive"));

  j = kimi_transformers();
  j["hidden_size"] = "24";
  CHECK(contains(file_error(j), "field hidden_size must be an integer"));

  j = kimi_transformers();
  j["routed_expert_hidden_size"] = 0;
  CHECK(contains(file_error(j), "field routed_expert_hidden_size must be positive"));
  // quantization_config: what dayzero does not load is refused by name
  j = kimi_transformers();
  j["quantization_config"] = {{"quant_method", "awq"}};
  CHECK(contains(file_error(j), "field quant_method 'awq' is not supported"));
  j["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "nvfp4-pack-quantized"}};
  CHECK(contains(file_error(j), "field format 'nvfp4-pack-quantized' is not supported"));
  j["quantization_config"] = {{"quant_method", "compressed-tensors"},
                              {"config_groups", {{"group_0", {{"format", "mxfp4-pack-quantized"},
                                                              {"weights", {{"num_bits", 4}, {"group_size", 16}}}}}}}};
  CHECK(contains(file_error(j), "field group_size is 16 (MXFP4: 32)"));
  j["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32;
  j["quantization_config"]["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}};
  CHECK(contains(file_error(j), "field input_activations are quantised"));

  j = kimi_transformers();
  j["mlp_layer_types"][2] = "moe";
  CHECK(contains(file_error(j), "field mlp_layer_types entry 2 is 'moe'"));

  j = kimi_transformers();
  j["num_experts_per_token"] = 9;
  CHECK(contains(file_error(j), "field num_experts_per_token 9 must be in 1..7"));

  CHECK(contains(error_of([] { ModelConfig::from_file("/nonexistent/config.json"); }),
                 "cannot read model config /nonexistent/config.json"));
  CHECK(contains(error_of([] { ModelConfig::from_json(json::array()); }), "not a JSON object"));

  // validate() on a hand-edited description
  ModelConfig c = ModelConfig::from_json(qwen());
  c.layers.pop_back();
  CHECK(contains(error_of([&] { c.validate(); }), "layer list has 4 entries"));
}

#ifdef DZ_SOURCE_DIR
TEST_CASE("config: configs saved by transformers 5.17 (tests/golden)", "[unit]") {
  const std::string g = std::string(DZ_SOURCE_DIR) + "/tests/golden/";
  if (!std::filesystem::exists(g + "kimi_linear/config.json")) return;  // goldens not checked out
  ModelConfig k = ModelConfig::from_file(g + "kimi_linear/config.json");
  check_layers(k, {{KDA, D, false}, {MLA, M, false}, {KDA, M, false}});
  CHECK((k.la_num_k_heads == 4 && k.la_head_k_dim == 16 && k.q_lora_rank == 0 && k.n_group == 2));
  ModelConfig d = ModelConfig::from_file(g + "deepseek_v32/config.json");
  check_layers(d, {{MLA, D, true}, {MLA, M, true}, {MLA, M, true}});
  CHECK((d.rope.yarn && d.rope.yarn_factor == 4.f && d.rope.yarn_original_max_pos == 64));
  CHECK((d.index_n_heads == 16 && d.index_head_dim == 32 && d.index_topk == 8 && d.pad_token_id == -1));
  ModelConfig q = ModelConfig::from_file(g + "qwen3_next/config.json");
  check_layers(q, {{GDN, M, false}, {GDN, M, false}, {GQA, M, false}});
  CHECK((q.shared_intermediate_size == 32 && q.rope.partial_rotary_factor == 0.25f && q.head_dim == 32));
  // transformers 5.23 writes the same three models' configs to the same descriptions
  for (const char* fam : {"kimi_linear", "deepseek_v32", "qwen3_next"}) {
    json a = ModelConfig::from_file(g + fam + "/config.json").to_json();
    json b = ModelConfig::from_file(g + fam + "_tf523/config.json").to_json();
    CHECK(a == b);
  }
}

TEST_CASE("config: qwen3_5_moe wrapper and qwen3_5_moe_text (transformers 5.23)", "[unit]") {
  const std::string g = std::string(DZ_SOURCE_DIR) + "/tests/golden/";
  if (!std::filesystem::exists(g + "qwen3_5_moe/config.json")) return;
  ModelConfig w = ModelConfig::from_file(g + "qwen3_5_moe/config.json");
  ModelConfig t = ModelConfig::from_file(g + "qwen3_5_moe_text/config.json");
  check_layers(w, {{GDN, M, false}, {GDN, M, false}, {GQA, M, false}});
  CHECK((w.family == Family::Qwen3Next && w.model_type == "qwen3_5_moe_text" && w.gdn_split_proj));
  CHECK((w.wrapper_model_type == "qwen3_5_moe" && w.has_vision && t.wrapper_model_type.empty() && !t.has_vision));
  json wj = w.to_json(), tj = t.to_json();
  wj.erase("wrapper");
  CHECK(wj == tj);
  CHECK((w.rope.partial_rotary_factor == 0.25f && w.head_dim == 32 && w.norm_topk_prob && w.shared_expert_gate));

  std::ifstream in(g + "qwen3_5_moe/config.json");
  const json j = json::parse(in);
  // norm_topk_prob is not a Qwen3.5 setting: its router always renormalises
  json n = j;
  n["text_config"]["norm_topk_prob"] = false;
  CHECK(ModelConfig::from_json(n).norm_topk_prob);
  // mrope_section must cover the rotary half-width (8 rotary dims -> 4 frequencies)
  json m = j;
  m["text_config"]["rope_parameters"]["mrope_section"] = json::array({2, 2, 2});
  CHECK(contains(error_of([&] { ModelConfig::from_json(m); }), "mrope_section"));
  CHECK(contains(error_of([&] { ModelConfig::from_json(m); }), "sums to 6 but the rotary half-width is 4"));
  // a wrapper without its text model
  json e = j;
  e.erase("text_config");
  CHECK(contains(error_of([&] { ModelConfig::from_json(e); }), "needs a text_config"));
  // the wrapper's token settings reach the text model when text_config lacks them
  json tie = j;
  tie["text_config"].erase("tie_word_embeddings");
  tie["tie_word_embeddings"] = true;
  CHECK(ModelConfig::from_json(tie).tie_word_embeddings);
  json mtp = j;
  mtp["text_config"]["mtp_num_hidden_layers"] = 1;
  CHECK(ModelConfig::from_json(mtp).mtp_layers == 1);
}
#endif

#ifdef DZ_SOURCE_DIR
// GLM-5 (glm_moe_dsa): deepseek_v32's stack, an interleaved-RoPE indexer and shared-indexer
// layers, from indexer_types or as transformers derives them.
TEST_CASE("config: glm_moe_dsa indexer_types, index_topk_pattern, index_topk_freq", "[unit]") {
  const std::string g = std::string(DZ_SOURCE_DIR) + "/tests/golden/";
  if (!std::filesystem::exists(g + "glm_moe_dsa/config.json")) return;
  std::ifstream in(g + "glm_moe_dsa/config.json");
  const json j = json::parse(in);
  ModelConfig c = ModelConfig::from_json(j);
  CHECK(c.family == Family::DeepseekV32);
  CHECK(c.index_rope_style == RopeStyle::Interleaved);
  CHECK(ModelConfig::from_file(g + "deepseek_v32/config.json").index_rope_style == RopeStyle::NeoX);
  auto shared = [](const ModelConfig& m) {
    std::string s;
    for (const LayerSpec& l : m.layers) s += l.shared_indexer ? 'S' : (l.has_indexer ? 'F' : '-');
    return s;
  };
  CHECK(shared(c) == "FSFS");
  json p = j;
  p.erase("indexer_types");
  p["index_topk_pattern"] = "FFSS";
  CHECK(shared(ModelConfig::from_json(p)) == "FFSS");
  json q = j;  // transformers' default: freq 1 (every layer full); freq 2 from offset 2: F F S F
  q.erase("indexer_types");
  CHECK(shared(ModelConfig::from_json(q)) == "FFFF");
  q["index_topk_freq"] = 2;
  CHECK(shared(ModelConfig::from_json(q)) == "FFSF");
  json bad = j;
  bad["indexer_types"] = json::array({"shared", "full", "full", "full"});
  CHECK(contains(error_of([&] { ModelConfig::from_json(bad); }), "layer 0 'shared'"));
  bad["indexer_types"] = json::array({"full", "sparse", "full", "full"});
  CHECK(contains(error_of([&] { ModelConfig::from_json(bad); }), "expected full or shared"));
  bad["indexer_types"] = json::array({"full", "full"});
  CHECK(contains(error_of([&] { ModelConfig::from_json(bad); }), "has 2 entries for 4 layers"));
  CHECK(c.to_json()["layers"][1]["indexer"] == "shared");
}
#endif

#ifdef DZ_SOURCE_DIR
// GLM-5.3-Flash (glm5_next wrapper, glm5_next_text): every new setting read, the wrong ones named.
TEST_CASE("config: glm5_next (GLM-5.3-Flash)", "[unit]") {
  const std::string g = std::string(DZ_SOURCE_DIR) + "/tests/golden/";
  if (!std::filesystem::exists(g + "glm5_next/config.json")) return;
  std::ifstream in(g + "glm5_next/config.json");
  const json j = json::parse(in);
  ModelConfig c = ModelConfig::from_json(j);
  CHECK((c.family == Family::Glm5Next && c.model_type == "glm5_next_text" && c.wrapper_model_type == "glm5_next"));
  check_layers(c, {{KDA, D, false}, {MLA, M, true}, {MLA, M, true}, {KDA, M, false}, {MLA, M, true}});
  CHECK((c.layers[2].shared_indexer && !c.layers[1].shared_indexer && !c.layers[4].shared_indexer));
  CHECK((c.hc_mult == 4 && c.hc_sinkhorn_iters == 20 && c.hc_eps == 1e-6f && c.swiglu_limit == 1.f));
  CHECK((c.index_kpool == 4 && c.index_kpool_tail && c.index_topk == 16 && c.dsa_sel_width() == 19));
  CHECK((c.kda_gate == KdaGate::LowerBoundSigmoid && c.kda_gate_lower_bound == -5.f));
  CHECK((c.qk_rope_head_dim == 0 && c.qk_nope_head_dim == 32 && c.mla_latent_norm_eps == c.rms_norm_eps));
  CHECK((c.score_func == ScoreFunc::Sigmoid && c.router_correction_bias && c.routed_scaling_factor == 2.5f));
  json t = j;
  t["text_config"]["linear_lower_bound"] = nullptr;  // transformers: the softplus gate
  CHECK(ModelConfig::from_json(t).kda_gate == KdaGate::Softplus);
  t = j;
  t["text_config"]["index_kpool"] = 5;
  CHECK(contains(error_of([&] { ModelConfig::from_json(t); }), "divide index_topk 16"));
  t = j;
  t["text_config"]["qk_rope_head_dim"] = 8;
  CHECK(contains(error_of([&] { ModelConfig::from_json(t); }), "no RoPE"));
  t = j;
  t["text_config"]["indexer_types"] = json::array({"full", "full", "full", "full", "shared"});  // after a KDA layer
  CHECK(contains(error_of([&] { ModelConfig::from_json(t); }), "layer 4 'shared' but layer 3 runs no indexer"));
  t = j;
  t["text_config"]["layer_types"][1] = "full_attention";
  CHECK(contains(error_of([&] { ModelConfig::from_json(t); }), "expected linear_attention or indexed_attention"));
}
#endif

// Found by tests/fuzz (fuzz_config): values that overflowed the normaliser's arithmetic or were
// read before they were checked are now field errors.
TEST_CASE("config: out-of-range integers and missing lists are field errors", "[unit]") {
  json d = deepseek();
  d["moe_intermediate_size"] = json(int64_t(9223372036854775807LL));
  CHECK(contains(error_of([&] { ModelConfig::from_json(d); }), "moe_intermediate_size is 9223372036854775807: out of range"));
  d = deepseek();
  d["vocab_size"] = 1e19;
  CHECK(contains(error_of([&] { ModelConfig::from_json(d); }), "vocab_size must be an integer within"));
  d = deepseek();
  d["vocab_size"] = 256.0;  // a whole float is still an integer
  CHECK(ModelConfig::from_json(d).vocab_size == 256);
  json g = {{"model_type", "glm5_next_text"}, {"vocab_size", 10}, {"hidden_size", 8}, {"num_hidden_layers", 1},
            {"num_attention_heads", 1}};
  CHECK(contains(error_of([&] { ModelConfig::from_json(g); }), "layer_types is missing"));
}
