// config.json -> ModelConfig for every supported family (see docs/formats.md, "Model directories").
//
// Defaults for absent fields follow the reference code of each layout:
// - kimi_linear, transformers layout: transformers' configuration_kimi_linear.py;
// - kimi_linear, original Moonshot layout (linear_attn_config present) and dayzero_hybrid:
//   Moonshot's configuration_kimi.py;
// - deepseek_v32: transformers' configuration_deepseek_v32.py (+ DeepSeek's config.json fields);
// - qwen3_next: transformers' configuration_qwen3_next.py.
// Dimensions that identify a model (vocab_size, hidden_size, num_hidden_layers,
// num_attention_heads) are always required: a default there never describes the checkpoint.
#include "config/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "core/error.hpp"

namespace dz {

using json = nlohmann::json;

const char* to_string(Family f) {
  switch (f) {
    case Family::KimiLinear: return "kimi_linear";
    case Family::DeepseekV32: return "deepseek_v32";
    case Family::Qwen3Next: return "qwen3_next";
    case Family::Dayzero: return "dayzero_hybrid";
    case Family::Glm5Next: return "glm5_next";
    case Family::DeepseekV4: return "deepseek_v4";
  }
  return "?";
}

const char* to_string(MixerKind m) {
  switch (m) {
    case MixerKind::KDA: return "KDA";
    case MixerKind::GDN: return "GDN";
    case MixerKind::MLA: return "MLA";
    case MixerKind::GQA: return "GQA";
    case MixerKind::DSV4: return "DSV4";
  }
  return "?";
}

const char* to_string(FfnKind f) {
  switch (f) {
    case FfnKind::Dense: return "dense";
    case FfnKind::MoE: return "moe";
  }
  return "?";
}

namespace {

// Every integer a config may hold is within ±2^31: no model dimension, count or token id comes
// near it, and it keeps the normaliser's sums and products of two inside int64 (found by
// tests/fuzz: a moe_intermediate_size of 2^63 - 1 times n_shared_experts overflowed).
constexpr int64_t kMaxConfigInt = int64_t(1) << 31;

// Typed access to one JSON object with field names in the error messages. A JSON null counts as
// absent (Hugging Face writes e.g. "q_lora_rank": null).
class Fields {
 public:
  Fields(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  // First of several aliases present, or nullptr.
  const char* pick(std::initializer_list<const char*> ks) const {
    for (const char* k : ks)
      if (has(k)) return k;
    return nullptr;
  }
  [[noreturn]] void bad(const std::string& k, const std::string& why) const {
    fail(str(where_, ": field ", k, " ", why));
  }

  int64_t i64(std::initializer_list<const char*> ks, int64_t def) const {
    const char* k = pick(ks);
    return k ? as_i64(k) : def;
  }
  int64_t i64_req(std::initializer_list<const char*> ks) const {
    const char* k = pick(ks);
    if (!k) bad(*ks.begin(), "is missing");
    return as_i64(k);
  }
  double num(std::initializer_list<const char*> ks, double def) const {
    const char* k = pick(ks);
    if (!k) return def;
    if (!j_[k].is_number()) bad(k, str("must be a number, got ", j_[k].dump()));
    return j_[k].get<double>();
  }
  bool boolean(std::initializer_list<const char*> ks, bool def) const {
    const char* k = pick(ks);
    if (!k) return def;
    if (!j_[k].is_boolean()) bad(k, str("must be true or false, got ", j_[k].dump()));
    return j_[k].get<bool>();
  }
  std::string string(std::initializer_list<const char*> ks, const std::string& def) const {
    const char* k = pick(ks);
    if (!k) return def;
    if (!j_[k].is_string()) bad(k, str("must be a string, got ", j_[k].dump()));
    return j_[k].get<std::string>();
  }
  std::vector<int64_t> ints(const char* k) const {
    if (!has(k)) bad(k, "is missing");
    if (!j_[k].is_array()) bad(k, "must be a list of integers");
    std::vector<int64_t> r;
    for (const auto& v : j_[k]) {
      if (!v.is_number_integer()) bad(k, str("must be a list of integers, has ", v.dump()));
      r.push_back(in_range(k, v));
    }
    return r;
  }
  std::vector<std::string> strings(const char* k) const {
    if (!has(k)) bad(k, "is missing");
    if (!j_[k].is_array()) bad(k, "must be a list of strings");
    std::vector<std::string> r;
    for (const auto& v : j_[k]) {
      if (!v.is_string()) bad(k, str("must be a list of strings, has ", v.dump()));
      r.push_back(v.get<std::string>());
    }
    return r;
  }
  Fields sub(const char* k) const {
    if (!has(k)) bad(k, "is missing");
    if (!j_[k].is_object()) bad(k, "must be an object");
    return Fields(j_[k], where_ + ": " + k);
  }
  const std::string& where() const { return where_; }
  const json& object() const { return j_; }

 private:
  int64_t in_range(const char* k, const json& v) const {
    // unsigned values beyond int64 read as their unsigned value, so compare in that domain too
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(kMaxConfigInt))
      bad(k, str("is ", v.dump(), ": out of range (at most 2^31)"));
    const int64_t x = v.get<int64_t>();
    if (x > kMaxConfigInt || x < -kMaxConfigInt) bad(k, str("is ", v.dump(), ": out of range (|value| <= 2^31)"));
    return x;
  }
  int64_t as_i64(const char* k) const {
    const json& v = j_[k];
    if (v.is_number_integer()) return in_range(k, v);
    // 1e-0 style floats that are whole numbers (some exporters write 4096.0); the range first, as
    // converting a double beyond int64 is undefined
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && std::fabs(d) <= double(kMaxConfigInt) && d == std::floor(d)) return int64_t(d);
    }
    bad(k, str("must be an integer within ±2^31, got ", v.dump()));
  }
  const json& j_;
  std::string where_;
};

// bos/eos/pad: integer, list (first entry) or null.
int64_t token_id(const json& j, const char* k) {
  if (!j.contains(k) || j[k].is_null()) return -1;
  const json& v = j[k];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
  return -1;
}

// "linear_attention"/"full_attention" per layer -> is-linear flags.
std::vector<bool> parse_layer_types(const Fields& f, const char* key, int64_t L) {
  std::vector<std::string> t = f.strings(key);
  if (int64_t(t.size()) != L) f.bad(key, str("has ", t.size(), " entries for ", L, " layers (num_hidden_layers)"));
  std::vector<bool> lin(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) {
    const std::string& s = t[size_t(i)];
    if (s == "linear_attention")
      lin[size_t(i)] = true;
    else if (s == "full_attention")
      lin[size_t(i)] = false;
    else
      f.bad(key, str("entry ", i, " is '", s, "' (expected linear_attention or full_attention)"));
  }
  return lin;
}

// 1-indexed kda_layers / full_attn_layers -> is-linear flags; every layer exactly once.
std::vector<bool> parse_kda_lists(const Fields& la, int64_t L) {
  std::vector<int> kind(size_t(L), -1);  // -1 unset, 1 KDA, 0 full
  for (const char* key : {"kda_layers", "full_attn_layers"}) {
    if (!la.has(key)) la.bad(key, "is missing");
    const int k = std::string(key) == "kda_layers" ? 1 : 0;
    for (int64_t idx : la.ints(key)) {
      if (idx < 1 || idx > L) la.bad(key, str("has layer ", idx, ", outside 1..", L, " (the lists are 1-indexed)"));
      int& slot = kind[size_t(idx - 1)];
      if (slot != -1) la.bad(key, str("layer ", idx, " is listed twice (in kda_layers and/or full_attn_layers)"));
      slot = k;
    }
  }
  std::vector<bool> lin(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) {
    if (kind[size_t(i)] == -1)
      la.bad("kda_layers",
             str("and full_attn_layers leave layer ", i + 1, " (1-indexed) neither KDA nor full attention"));
    lin[size_t(i)] = kind[size_t(i)] == 1;
  }
  return lin;
}

// mlp_layer_types ["dense"/"sparse"] -> is-MoE flags, or nullopt-like empty when absent.
std::vector<bool> parse_mlp_types(const Fields& f, int64_t L) {
  std::vector<std::string> t = f.strings("mlp_layer_types");
  if (int64_t(t.size()) != L)
    f.bad("mlp_layer_types", str("has ", t.size(), " entries for ", L, " layers (num_hidden_layers)"));
  std::vector<bool> moe(static_cast<size_t>(L));
  for (int64_t i = 0; i < L; ++i) {
    const std::string& s = t[size_t(i)];
    if (s != "dense" && s != "sparse")
      f.bad("mlp_layer_types", str("entry ", i, " is '", s, "' (expected dense or sparse)"));
    moe[size_t(i)] = s == "sparse";
  }
  return moe;
}

// rope_theta, rope_scaling (v4: {"type"|"rope_type": "yarn", ...}) or rope_parameters (v5).
// One RoPE parameter set (a rope_parameters entry): theta, default or YaRN.
void parse_rope_params(const Fields& p, RopeConfig* r, int64_t max_pos) {
  r->theta = float(p.num({"rope_theta"}, r->theta));
  const std::string type = p.string({"rope_type", "type"}, "default");
  if (type == "default") return;
  if (type != "yarn") p.bad("rope_type", str("'", type, "' is not supported (default or yarn)"));
  r->yarn = true;
  r->yarn_factor = float(p.num({"factor"}, 1.0));
  r->yarn_original_max_pos = p.i64({"original_max_position_embeddings"}, max_pos);
  r->yarn_beta_fast = float(p.num({"beta_fast"}, 32.0));
  r->yarn_beta_slow = float(p.num({"beta_slow"}, 1.0));
  r->yarn_mscale = float(p.num({"mscale"}, 1.0));
  r->yarn_mscale_all_dim = float(p.num({"mscale_all_dim"}, 0.0));
  if (p.has("attention_factor")) r->yarn_attention_factor = float(p.num({"attention_factor"}, 1.0));
}

void parse_rope(const Fields& f, RopeConfig* r, float default_partial) {
  r->theta = float(f.num({"rope_theta"}, 10000.0));
  r->partial_rotary_factor = float(f.num({"partial_rotary_factor"}, default_partial));
  const char* key = f.pick({"rope_parameters", "rope_scaling"});
  if (!key) return;
  Fields p = f.sub(key);
  r->partial_rotary_factor = float(p.num({"partial_rotary_factor"}, r->partial_rotary_factor));
  // transformers falls back to max_position_embeddings when the original length is absent
  parse_rope_params(p, r, f.i64({"max_position_embeddings"}, 4096));
}

void parse_common(const Fields& f, const json& j, ModelConfig* c, double default_eps) {
  c->vocab_size = f.i64_req({"vocab_size"});
  c->hidden_size = f.i64_req({"hidden_size"});
  c->num_layers = f.i64_req({"num_hidden_layers"});
  if (c->num_layers <= 0 || c->num_layers > 100000) f.bad("num_hidden_layers", str("is ", c->num_layers));
  c->rms_norm_eps = float(f.num({"rms_norm_eps"}, default_eps));
  c->tie_word_embeddings = f.boolean({"tie_word_embeddings"}, false);
  c->bos_token_id = token_id(j, "bos_token_id");
  c->eos_token_id = token_id(j, "eos_token_id");
  c->pad_token_id = token_id(j, "pad_token_id");
  c->hidden_act = f.string({"hidden_act"}, "silu");
  c->num_heads = f.i64_req({"num_attention_heads"});
  c->layers.assign(size_t(c->num_layers), LayerSpec{});
}

// MLA fields shared by kimi_linear, deepseek_v32 and dayzero (defaults: the caller's layout).
struct MlaDefaults {
  int64_t q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v_head;
};
void parse_mla(const Fields& f, ModelConfig* c, const MlaDefaults& d, bool required) {
  if (required) {
    c->kv_lora_rank = f.i64_req({"kv_lora_rank"});
    c->qk_nope_head_dim = f.i64_req({"qk_nope_head_dim"});
    c->qk_rope_head_dim = f.i64_req({"qk_rope_head_dim"});
    c->v_head_dim = f.i64_req({"v_head_dim"});
  } else {
    c->kv_lora_rank = f.i64({"kv_lora_rank"}, d.kv_lora_rank);
    c->qk_nope_head_dim = f.i64({"qk_nope_head_dim"}, d.qk_nope);
    c->qk_rope_head_dim = f.i64({"qk_rope_head_dim"}, d.qk_rope);
    c->v_head_dim = f.i64({"v_head_dim"}, d.v_head);
  }
  c->q_lora_rank = f.i64({"q_lora_rank"}, d.q_lora_rank);  // null -> 0: q_proj straight from hidden
  c->num_kv_heads = f.i64({"num_key_value_heads"}, c->num_heads);
}

// Kimi / dayzero MoE fields, both spellings (Moonshot names; transformers' attribute_map aliases).
struct KimiMoeDefaults {
  int64_t n_shared;
  float routed_scaling;
  int64_t first_k_dense;
};
void parse_kimi_moe(const Fields& f, ModelConfig* c, const KimiMoeDefaults& d) {
  c->n_routed_experts = f.i64({"num_experts", "num_local_experts", "n_routed_experts"}, 0);
  c->intermediate_size = f.i64({"dense_ffn_hidden", "intermediate_size"}, 0);
  if (c->n_routed_experts > 0) {
    c->num_experts_per_tok = f.i64_req({"num_experts_per_token", "num_experts_per_tok"});
    c->moe_intermediate_size = f.i64_req({"moe_intermediate_size"});
  }
  c->n_shared_experts = f.i64({"num_shared_experts", "n_shared_experts"}, d.n_shared);
  c->shared_intermediate_size = c->moe_intermediate_size * c->n_shared_experts;
  c->norm_topk_prob = f.boolean({"moe_renormalize", "norm_topk_prob"}, true);
  c->routed_scaling_factor = float(f.num({"routed_scaling_factor"}, d.routed_scaling));
  const std::string act = f.string({"moe_router_activation_func", "scoring_func"}, "sigmoid");
  if (act == "sigmoid")
    c->score_func = ScoreFunc::Sigmoid;
  else if (act == "softmax")
    c->score_func = ScoreFunc::Softmax;
  else
    f.bad("moe_router_activation_func", str("is '", act, "' (expected sigmoid or softmax)"));
  const bool grouped = f.boolean({"use_grouped_topk"}, true);
  c->n_group = grouped ? f.i64({"num_expert_group", "n_group"}, 1) : 1;
  c->topk_group = grouped ? f.i64({"topk_group"}, 1) : 1;
  c->router_correction_bias = true;  // both Kimi codes always carry e_score_correction_bias
  // Dense vs MoE: explicit list, else the DeepSeek-V3 rule (first_k_dense_replace, moe_layer_freq).
  std::vector<bool> moe;
  if (f.has("mlp_layer_types")) {
    moe = parse_mlp_types(f, c->num_layers);
  } else {
    const int64_t fk = f.i64({"first_k_dense_replace"}, d.first_k_dense);
    const int64_t freq = f.i64({"moe_layer_freq"}, 1);
    if (freq <= 0) f.bad("moe_layer_freq", str("must be positive, got ", freq));
    for (int64_t i = 0; i < c->num_layers; ++i) moe.push_back(c->n_routed_experts > 0 && i >= fk && i % freq == 0);
  }
  for (int64_t i = 0; i < c->num_layers; ++i) {
    c->layers[size_t(i)].ffn = moe[size_t(i)] ? FfnKind::MoE : FfnKind::Dense;
    if (moe[size_t(i)] && c->n_routed_experts <= 0)
      f.bad("num_experts", "is missing but mlp_layer_types has sparse layers");
  }
}

// KDA gate from linear_attn_config (Moonshot/K3: gate_lower_bound; dayzero: gate + lower_bound) or
// transformers' top-level spelling.
void parse_kda_gate(const Fields& f, const Fields* la, ModelConfig* c) {
  bool have_lb = false;
  float lb = c->kda_gate_lower_bound;
  std::string gate;
  if (la) {
    if (const char* k = la->pick({"gate_lower_bound", "lower_bound"})) {
      have_lb = true;
      lb = float(la->num({k}, lb));
    }
    gate = la->string({"gate"}, "");
  }
  if (const char* k = f.pick({"forget_gate_lower_bound", "kda_gate_lower_bound"})) {
    have_lb = true;
    lb = float(f.num({k}, lb));
  }
  if (gate.empty()) gate = have_lb ? "lower_bound_sigmoid" : "softplus";
  if (gate == "softplus") {
    c->kda_gate = KdaGate::Softplus;
  } else if (gate == "lower_bound_sigmoid") {
    c->kda_gate = KdaGate::LowerBoundSigmoid;
    c->kda_gate_lower_bound = lb;
    if (!(lb < 0.f)) (la ? *la : f).bad("lower_bound", str("must be negative, got ", lb));
  } else {
    (la ? *la : f).bad("gate", str("is '", gate, "' (expected softplus or lower_bound_sigmoid)"));
  }
}

// Kimi K3's additions to the Kimi Linear text config: SiTU, the latent MoE, the full-rank KDA
// output gate (linear_attn_config.use_full_rank_gate).
void parse_k3_features(const Fields& f, const json& j, const Fields* la, ModelConfig* c) {
  if (c->hidden_act == "situ") {
    c->situ_beta = float(f.num({"activation_situ_beta"}, 4.0));  // the config classes' default (4.0 published)
    // absent: the default 25.0; null: no bound on the up branch (the reference's linear_beta None)
    const bool null_lb = j.contains("activation_situ_linear_beta") && j["activation_situ_linear_beta"].is_null();
    c->situ_linear_beta = null_lb ? 0.f : float(f.num({"activation_situ_linear_beta"}, 25.0));
    if (!(c->situ_beta > 0.f) || !std::isfinite(c->situ_beta))
      f.bad("activation_situ_beta", str("must be positive, got ", c->situ_beta));
    if (!null_lb && (!(c->situ_linear_beta > 0.f) || !std::isfinite(c->situ_linear_beta)))
      f.bad("activation_situ_linear_beta", str("must be positive (or null), got ", c->situ_linear_beta));
  }
  c->moe_latent_size = f.i64({"routed_expert_hidden_size"}, 0);
  if (f.has("routed_expert_hidden_size") && c->moe_latent_size <= 0)
    f.bad("routed_expert_hidden_size", str("must be positive (or null: no latent MoE), got ", c->moe_latent_size));
  c->moe_latent_norm = f.boolean({"latent_moe_use_norm"}, true);
  if (la) c->kda_full_rank_gate = la->boolean({"use_full_rank_gate"}, false);
  c->kda_full_rank_gate = f.boolean({"use_full_rank_gate"}, c->kda_full_rank_gate);
}

void parse_kimi(const Fields& f, const json& j, ModelConfig* c, bool dayzero) {
  const bool original = f.has("linear_attn_config");
  if (dayzero && !original) f.bad("linear_attn_config", "is missing");
  parse_common(f, j, c, original ? 1e-6 : 1e-5);
  std::unique_ptr<Fields> la;
  if (original) la = std::make_unique<Fields>(f.sub("linear_attn_config"));

  // Token mixers: layer_types (transformers) and/or 1-indexed lists (Moonshot); both must agree.
  std::vector<bool> lin;
  if (f.has("layer_types")) lin = parse_layer_types(f, "layer_types", c->num_layers);
  if (la && (la->has("kda_layers") || la->has("full_attn_layers") || lin.empty())) {
    std::vector<bool> lin2 = parse_kda_lists(*la, c->num_layers);
    if (!lin.empty() && lin != lin2)
      f.bad("layer_types", "disagrees with linear_attn_config.kda_layers / full_attn_layers");
    lin = lin2;
  }
  if (lin.empty()) f.bad("layer_types", "is missing (or give linear_attn_config.kda_layers and full_attn_layers)");

  // KDA dims: KDA uses one head count and one head size for q, k and v.
  const int64_t H = la ? la->i64({"num_heads"}, f.i64({"linear_num_heads"}, 32)) : f.i64({"linear_num_heads"}, 32);
  const int64_t K = la ? la->i64({"head_dim"}, f.i64({"linear_head_dim"}, 128)) : f.i64({"linear_head_dim"}, 128);
  const int64_t W = la ? la->i64({"short_conv_kernel_size"}, f.i64({"linear_conv_kernel_dim"}, 4))
                       : f.i64({"linear_conv_kernel_dim"}, 4);
  if (dayzero) {
    la->i64_req({"num_heads"});
    la->i64_req({"head_dim"});
  }
  c->la_num_k_heads = c->la_num_v_heads = H;
  c->la_head_k_dim = c->la_head_v_dim = K;
  c->la_conv_kernel = W;
  parse_kda_gate(f, la.get(), c);
  parse_k3_features(f, j, la.get(), c);

  // MLA (transformers defaults; Moonshot's are None, i.e. required, but transformers fills them).
  parse_mla(f, c, MlaDefaults{0, 512, 128, 64, 128}, dayzero);
  c->mla_output_gate = f.boolean({"mla_use_output_gate"}, false);
  parse_rope(f, &c->rope, 1.f);
  c->rope.style = RopeStyle::Interleaved;  // DeepSeek-style MLA (Kimi's MLA uses no RoPE at all)

  // DSA indexer: dayzero only (Kimi Linear has none).
  if (dayzero) {
    c->index_topk = f.i64({"index_topk"}, 0);
    if (c->index_topk > 0) {
      c->index_n_heads = f.i64_req({"index_n_heads"});
      c->index_head_dim = f.i64_req({"index_head_dim"});
    }
  }
  for (int64_t i = 0; i < c->num_layers; ++i) {
    LayerSpec& l = c->layers[size_t(i)];
    l.mixer = lin[size_t(i)] ? MixerKind::KDA : MixerKind::MLA;
    l.has_indexer = !lin[size_t(i)] && c->index_topk > 0;
  }

  parse_kimi_moe(f, c, original ? KimiMoeDefaults{0, 1.0f, 0} : KimiMoeDefaults{1, 2.446f, 1});
  c->attn_res_block_size = f.i64({"attn_res_block_size"}, 0);
}

// DeepSeek-style MoE sizes and router settings (deepseek_v32, glm_moe_dsa, glm5_next_text).
struct DeepseekMoeDefaults {
  int64_t intermediate, experts, n_group, topk_group;
};
void parse_deepseek_moe(const Fields& f, ModelConfig* c, const DeepseekMoeDefaults& d) {
  c->intermediate_size = f.i64({"intermediate_size"}, d.intermediate);
  c->n_routed_experts = f.i64({"n_routed_experts", "num_local_experts", "num_experts"}, d.experts);
  c->num_experts_per_tok = f.i64({"num_experts_per_tok"}, 8);
  c->moe_intermediate_size = f.i64({"moe_intermediate_size"}, 2048);
  c->n_shared_experts = f.i64({"n_shared_experts"}, 1);
  c->shared_intermediate_size = c->moe_intermediate_size * c->n_shared_experts;
  c->norm_topk_prob = f.boolean({"norm_topk_prob"}, true);
  c->routed_scaling_factor = float(f.num({"routed_scaling_factor"}, 2.5));
  c->n_group = f.i64({"n_group"}, d.n_group);
  c->topk_group = f.i64({"topk_group"}, d.topk_group);
}

// indexer_types as transformers' GlmMoeDsaConfig / Glm5NextTextConfig derive it: the list itself,
// else index_topk_pattern ("F"/"S" per layer), else index_topk_freq / index_skip_topk_offset.
// Returns per layer whether it is "shared".
std::vector<bool> parse_indexer_types(const Fields& f, const json& j, int64_t L) {
  std::vector<bool> shared(size_t(L), false);
  if (f.has("indexer_types") && !j["indexer_types"].is_null()) {
    const std::vector<std::string> t = f.strings("indexer_types");
    if (int64_t(t.size()) != L) f.bad("indexer_types", str("has ", t.size(), " entries for ", L, " layers (num_hidden_layers)"));
    for (size_t i = 0; i < t.size(); ++i) {
      if (t[i] != "full" && t[i] != "shared") f.bad("indexer_types", str("entry ", i, " is '", t[i], "' (expected full or shared)"));
      shared[i] = t[i] == "shared";
    }
  } else if (f.has("index_topk_pattern")) {
    const std::string pat = f.string({"index_topk_pattern"}, "");
    if (int64_t(pat.size()) != L) f.bad("index_topk_pattern", str("has ", pat.size(), " letters for ", L, " layers"));
    for (size_t i = 0; i < pat.size(); ++i) {
      if (pat[i] != 'F' && pat[i] != 'S') f.bad("index_topk_pattern", str("letter ", i, " is '", pat[i], "' (F or S)"));
      shared[i] = pat[i] == 'S';
    }
  } else {
    const int64_t freq = std::max<int64_t>(f.i64({"index_topk_freq"}, 1), 1);
    const int64_t off = f.i64({"index_skip_topk_offset"}, 2);
    for (int64_t i = 0; i < L; ++i) shared[size_t(i)] = std::max<int64_t>(i - off + 1, 0) % freq != 0;
  }
  if (L > 0 && shared[0]) f.bad("indexer_types", "makes layer 0 'shared', but no earlier layer runs an indexer");
  return shared;
}

// deepseek_v32, and glm_moe_dsa (GLM): GLM-5 is DeepSeek-V3.2's stack with its own defaults, an
// interleaved RoPE in the indexer, and indexer_types whose "shared" layers reuse the Top-K of the
// last "full" one.
void parse_deepseek_v32(const Fields& f, const json& j, ModelConfig* c, bool glm) {
  parse_common(f, j, c, glm ? 1e-5 : 1e-6);
  parse_mla(f, c, glm ? MlaDefaults{2048, 512, 192, 64, 256} : MlaDefaults{1536, 512, 128, 64, 128}, false);
  parse_rope(f, &c->rope, 1.f);
  c->index_rope_style = glm ? RopeStyle::Interleaved : RopeStyle::NeoX;
  // DeepSeek rotates adjacent pairs; transformers' rope_interleave=false would mean rotate-halves.
  c->rope.style = f.boolean({"rope_interleave"}, true) ? RopeStyle::Interleaved : RopeStyle::NeoX;
  c->index_n_heads = f.i64({"index_n_heads"}, glm ? 32 : 64);
  c->index_head_dim = f.i64({"index_head_dim"}, 128);
  c->index_topk = f.i64({"index_topk"}, 2048);
  c->mtp_layers = f.i64({"num_nextn_predict_layers"}, 0);
  if (f.has("layer_types")) {
    for (const std::string& s : f.strings("layer_types"))
      // transformers 5.23's save_pretrained writes "indexed_attention"; earlier releases
      // "deepseek_sparse_attention"; all of them mean MLA + the DSA indexer.
      if (s != "deepseek_sparse_attention" && s != "indexed_attention" && s != "full_attention")
        f.bad("layer_types", str("has '", s,
                                 "' (deepseek_v32 layers are deepseek_sparse_attention / indexed_attention)"));
  }

  parse_deepseek_moe(f, c, DeepseekMoeDefaults{18432, 256, glm ? 1 : 8, glm ? 1 : 4});
  const std::string sf = f.string({"scoring_func"}, "sigmoid");
  if (sf == "sigmoid")
    c->score_func = ScoreFunc::Sigmoid;
  else if (sf == "softmax")
    c->score_func = ScoreFunc::Softmax;
  else
    f.bad("scoring_func", str("is '", sf, "' (expected sigmoid or softmax)"));
  const std::string tm = f.string({"topk_method"}, "noaux_tc");
  if (tm != "noaux_tc" && tm != "greedy" && tm != "group_limited_greedy")
    f.bad("topk_method", str("is '", tm, "' (expected noaux_tc, greedy or group_limited_greedy)"));
  c->router_correction_bias = tm == "noaux_tc";  // e_score_correction_bias only with noaux_tc
  if (tm == "greedy") c->n_group = c->topk_group = 1;

  std::vector<bool> moe;
  if (f.has("mlp_layer_types")) {
    moe = parse_mlp_types(f, c->num_layers);
  } else {
    const int64_t fk = f.i64({"first_k_dense_replace"}, 3);
    const int64_t freq = f.i64({"moe_layer_freq"}, 1);
    if (freq <= 0) f.bad("moe_layer_freq", str("must be positive, got ", freq));
    for (int64_t i = 0; i < c->num_layers; ++i) moe.push_back(c->n_routed_experts > 0 && i >= fk && i % freq == 0);
  }
  const std::vector<bool> shared = glm ? parse_indexer_types(f, j, c->num_layers) : std::vector<bool>(size_t(c->num_layers));
  for (int64_t i = 0; i < c->num_layers; ++i) {
    LayerSpec& l = c->layers[size_t(i)];
    l.mixer = MixerKind::MLA;
    l.has_indexer = true;
    l.shared_indexer = shared[size_t(i)];
    l.ffn = moe[size_t(i)] ? FfnKind::MoE : FfnKind::Dense;
  }
}

// qwen3_next, and qwen3_5_moe_text (QWEN35): the same modules with separate GDN in-projections,
// multimodal RoPE sections, every layer MoE and the top-k weights always renormalised.
void parse_qwen3_next(const Fields& f, const json& j, ModelConfig* c, bool qwen35) {
  parse_common(f, j, c, 1e-6);
  c->gdn_split_proj = qwen35;
  c->norm_zero_centered = true;
  c->attn_output_gate = true;
  c->num_kv_heads = f.i64({"num_key_value_heads"}, 2);
  c->head_dim = f.i64({"head_dim"}, 256);
  parse_rope(f, &c->rope, 0.25f);
  c->rope.style = RopeStyle::NeoX;
  if (qwen35) {
    // mrope_section splits the rotary frequencies among (t, h, w) position ids; a text-only
    // document has t = h = w = its positions, which makes it plain NeoX RoPE. Only the split's
    // size is checked (against the rotary half-width).
    const char* key = f.pick({"rope_parameters", "rope_scaling"});
    if (key && f.sub(key).has("mrope_section")) {
      Fields p = f.sub(key);
      int64_t sum = 0;
      for (int64_t v : p.ints("mrope_section")) sum += v;
      const double rot = double(c->head_dim) * double(c->rope.partial_rotary_factor);  // in double: may be huge
      if (!(rot >= 0 && rot <= double(kMaxConfigInt)))
        f.bad("partial_rotary_factor", str(c->rope.partial_rotary_factor, " x head_dim ", c->head_dim, " is out of range"));
      const int64_t half = int64_t(rot) / 2;
      if (sum != half)
        p.bad("mrope_section", str("sums to ", sum, " but the rotary half-width is ", half,
                                   " (head_dim x partial_rotary_factor / 2)"));
    }
  }
  // Qwen3.5 names its MTP layers mtp_num_hidden_layers; Qwen3-Next configs carry either key.
  c->mtp_layers = f.i64({"mtp_num_hidden_layers", "num_nextn_predict_layers"}, 0);
  c->la_num_k_heads = f.i64({"linear_num_key_heads"}, 16);
  c->la_num_v_heads = f.i64({"linear_num_value_heads"}, 32);
  c->la_head_k_dim = f.i64({"linear_key_head_dim"}, 128);
  c->la_head_v_dim = f.i64({"linear_value_head_dim"}, 128);
  c->la_conv_kernel = f.i64({"linear_conv_kernel_dim"}, 4);

  std::vector<bool> lin;
  if (f.has("layer_types")) {
    lin = parse_layer_types(f, "layer_types", c->num_layers);
  } else {
    const int64_t every = f.i64({"full_attention_interval"}, 4);
    if (every <= 0) f.bad("full_attention_interval", str("must be positive, got ", every));
    for (int64_t i = 0; i < c->num_layers; ++i) lin.push_back((i + 1) % every != 0);
  }

  c->intermediate_size = f.i64({"intermediate_size"}, qwen35 ? 0 : 5632);
  c->n_routed_experts = f.i64({"num_experts", "num_local_experts"}, qwen35 ? 256 : 512);
  c->num_experts_per_tok = f.i64({"num_experts_per_tok"}, qwen35 ? 8 : 10);
  c->moe_intermediate_size = f.i64({"moe_intermediate_size"}, 512);
  c->shared_intermediate_size = f.i64({"shared_expert_intermediate_size"}, 512);
  c->n_shared_experts = c->shared_intermediate_size > 0 ? 1 : 0;
  c->shared_expert_gate = c->n_shared_experts > 0;
  // Qwen3.5's router renormalises the top-k weights whatever the config says.
  c->norm_topk_prob = qwen35 ? true : f.boolean({"norm_topk_prob"}, true);
  c->score_func = ScoreFunc::Softmax;
  c->routed_scaling_factor = 1.f;
  c->n_group = c->topk_group = 1;
  c->router_correction_bias = false;

  std::vector<bool> moe;
  if (f.has("mlp_layer_types")) {
    moe = parse_mlp_types(f, c->num_layers);
  } else {
    std::set<int64_t> dense_only;
    if (f.has("mlp_only_layers"))
      for (int64_t i : f.ints("mlp_only_layers")) {
        if (i < 0 || i >= c->num_layers)
          f.bad("mlp_only_layers", str("has layer ", i, ", outside 0..", c->num_layers - 1, " (0-indexed)"));
        dense_only.insert(i);
      }
    const int64_t step = f.i64({"decoder_sparse_step"}, 1);
    if (step <= 0) f.bad("decoder_sparse_step", str("must be positive, got ", step));
    for (int64_t i = 0; i < c->num_layers; ++i)
      moe.push_back(!dense_only.count(i) && c->n_routed_experts > 0 && (i + 1) % step == 0);
  }
  for (int64_t i = 0; i < c->num_layers; ++i) {
    LayerSpec& l = c->layers[size_t(i)];
    l.mixer = lin[size_t(i)] ? MixerKind::GDN : MixerKind::GQA;
    l.ffn = moe[size_t(i)] ? FfnKind::MoE : FfnKind::Dense;
  }
}

// glm5_next_text (GLM-5.3-Flash; the glm5_next wrapper's text_config): Kimi's KDA (lower-bound
// gate), MLA without RoPE (q-LoRA, latent norms at rms_norm_eps) with the k-pool DSA indexer and
// shared-indexer layers, DeepSeek's sigmoid MoE with the SwiGLU clamp, mHC residual streams.
void parse_glm5_next(const Fields& f, const json& j, ModelConfig* c) {
  parse_common(f, j, c, 1e-5);
  const int64_t L = c->num_layers;
  std::vector<bool> is_lin(static_cast<size_t>(L), false);
  {
    const std::vector<std::string> t = f.strings("layer_types");
    if (int64_t(t.size()) != L) f.bad("layer_types", str("has ", t.size(), " entries for ", L, " layers (num_hidden_layers)"));
    for (int64_t i = 0; i < L; ++i) {
      const std::string& s = t[size_t(i)];
      if (s != "linear_attention" && s != "indexed_attention")
        f.bad("layer_types", str("entry ", i, " is '", s, "' (expected linear_attention or indexed_attention)"));
      is_lin[size_t(i)] = s == "linear_attention";
    }
  }
  c->la_num_k_heads = c->la_num_v_heads = f.i64({"linear_num_heads"}, 64);
  c->la_head_k_dim = c->la_head_v_dim = f.i64({"linear_head_dim"}, 128);
  c->la_conv_kernel = f.i64({"linear_conv_kernel_dim"}, 4);
  if (j.contains("linear_lower_bound") && j["linear_lower_bound"].is_null()) {
    c->kda_gate = KdaGate::Softplus;  // transformers: no lower bound -> -exp(A_log) softplus(g)
  } else {
    c->kda_gate = KdaGate::LowerBoundSigmoid;
    c->kda_gate_lower_bound = float(f.num({"linear_lower_bound"}, -5.0));
  }
  parse_mla(f, c, MlaDefaults{1536, 512, 256, 0, 256}, false);
  c->mla_latent_norm_eps = c->rms_norm_eps;
  parse_rope(f, &c->rope, 1.f);
  if (c->qk_rope_head_dim != 0) f.bad("qk_rope_head_dim", str("is ", c->qk_rope_head_dim, " (GLM-5.3-Flash's MLA has no RoPE)"));
  c->index_n_heads = f.i64({"index_n_heads"}, 32);
  c->index_head_dim = f.i64({"index_head_dim"}, 128);
  c->index_topk = f.i64({"index_topk"}, 2048);
  c->index_kpool = f.i64({"index_kpool"}, 16);
  c->index_kpool_tail = f.boolean({"index_kpool_always_select_tail"}, true);
  if (c->index_kpool <= 0 || c->index_topk % c->index_kpool != 0)
    f.bad("index_kpool", str("is ", c->index_kpool, ": must be positive and divide index_topk ", c->index_topk));
  std::vector<bool> shared = parse_indexer_types(f, j, L);
  c->swiglu_limit = float(f.num({"swiglu_limit"}, 10.0));
  if (c->swiglu_limit < 0) f.bad("swiglu_limit", "must not be negative");
  c->hc_mult = f.i64({"hc_mult"}, 4);
  c->hc_eps = float(f.num({"hc_eps"}, 1e-6));
  c->hc_sinkhorn_iters = f.i64({"hc_sinkhorn_iters"}, 20);
  if (c->hc_mult < 1 || c->hc_sinkhorn_iters < 1)
    f.bad("hc_mult", str("hc_mult ", c->hc_mult, " and hc_sinkhorn_iters ", c->hc_sinkhorn_iters, " must be >= 1"));

  parse_deepseek_moe(f, c, DeepseekMoeDefaults{12288, 288, 1, 1});
  c->score_func = ScoreFunc::Sigmoid;
  c->router_correction_bias = true;
  std::vector<bool> moe;
  if (f.has("mlp_layer_types")) {
    moe = parse_mlp_types(f, L);
  } else {
    const int64_t fk = f.i64({"first_k_dense_replace"}, 1);
    for (int64_t i = 0; i < L; ++i) moe.push_back(c->n_routed_experts > 0 && i >= fk);
  }
  // A shared layer takes the sets of the attention layer right before it (transformers hands them
  // on only from one decoder layer to the next).
  for (int64_t i = 0; i < L; ++i) {
    LayerSpec& l = c->layers[size_t(i)];
    l.mixer = is_lin[size_t(i)] ? MixerKind::KDA : MixerKind::MLA;
    l.has_indexer = !is_lin[size_t(i)];
    l.shared_indexer = !is_lin[size_t(i)] && shared[size_t(i)];
    if (l.shared_indexer && (i == 0 || is_lin[size_t(i) - 1]))
      f.bad("indexer_types", str("makes layer ", i, " 'shared' but layer ", i - 1, " runs no indexer"));
    l.ffn = moe[size_t(i)] ? FfnKind::MoE : FfnKind::Dense;
  }
}

// deepseek_v4 (transformers 5.23 DeepseekV4Config, with the legacy keys its __post_init__ folds in:
// compress_ratios, compress_rate_csa / _hca, num_hash_layers, qk_rope_head_dim, a flat YaRN
// rope_parameters). Shared-KV MQA (one KV head of head_dim) over a sliding window plus, per layer
// type, compressed entries (CSA with its indexer / HCA); mHC streams with a weighted head;
// sqrtsoftplus (or softmax / sigmoid) MoE whose first layers may route by a token-id hash.
void parse_deepseek_v4(const Fields& f, const json& j, ModelConfig* c) {
  parse_common(f, j, c, 1e-6);
  const int64_t L = c->num_layers;
  c->num_kv_heads = f.i64({"num_key_value_heads"}, 1);
  if (c->num_kv_heads != 1) f.bad("num_key_value_heads", str("is ", c->num_kv_heads, " (DeepSeek-V4 has one shared KV head)"));
  c->head_dim = f.i64({"head_dim"}, 512);
  c->q_lora_rank = f.i64({"q_lora_rank"}, 1024);
  if (c->q_lora_rank <= 0) f.bad("q_lora_rank", "must be positive");
  const double prf = f.has("partial_rotary_factor") ? f.num({"partial_rotary_factor"}, 0.125)
                     : f.has("qk_rope_head_dim")    ? double(f.i64({"qk_rope_head_dim"}, 64)) / double(c->head_dim)
                                                    : 64.0 / 512.0;
  c->qk_rope_head_dim = int64_t(std::llround(prf * double(c->head_dim)));
  if (c->qk_rope_head_dim <= 0 || c->qk_rope_head_dim % 2 || c->qk_rope_head_dim > c->head_dim ||
      std::fabs(prf * double(c->head_dim) - double(c->qk_rope_head_dim)) > 1e-6)
    f.bad("partial_rotary_factor", str(prf, " x head_dim ", c->head_dim, " is not an even number of rotary dims"));
  c->sliding_window = f.i64({"sliding_window"}, 128);
  if (c->sliding_window <= 0) f.bad("sliding_window", "must be positive");
  c->o_groups = f.i64({"o_groups"}, 8);
  c->o_lora_rank = f.i64({"o_lora_rank"}, 1024);
  if (c->o_groups <= 0 || c->num_heads % c->o_groups != 0)
    f.bad("o_groups", str("is ", c->o_groups, ": must be positive and divide num_attention_heads ", c->num_heads));
  if (c->o_lora_rank <= 0) f.bad("o_lora_rank", "must be positive");
  c->index_n_heads = f.i64({"index_n_heads"}, 64);
  c->index_head_dim = f.i64({"index_head_dim"}, 128);
  c->index_topk = f.i64({"index_topk"}, 512);
  if (c->index_head_dim < c->qk_rope_head_dim)
    f.bad("index_head_dim", str(c->index_head_dim, " is smaller than the ", c->qk_rope_head_dim, " rotary dims"));

  // compress rates per attention type
  int64_t rate_csa = 4, rate_hca = 128;
  if (f.has("compress_rates")) {
    const Fields cr = f.sub("compress_rates");
    rate_csa = cr.i64({"compressed_sparse_attention"}, rate_csa);
    rate_hca = cr.i64({"heavily_compressed_attention"}, rate_hca);
  }
  rate_csa = f.i64({"compress_rate_csa"}, rate_csa);
  rate_hca = f.i64({"compress_rate_hca"}, rate_hca);
  if (rate_csa <= 0 || rate_hca <= 0) f.bad("compress_rates", str("must be positive (", rate_csa, ", ", rate_hca, ")"));
  // per layer: 0 sliding, else the compress rate (CSA when == rate_csa and indexed); an entry L
  // (the published compress_ratios carry one) is the MTP block's
  std::vector<int64_t> rates;
  std::vector<bool> csa(size_t(L + 1), false);
  if (f.has("layer_types")) {
    const std::vector<std::string> t = f.strings("layer_types");
    if (int64_t(t.size()) < L) f.bad("layer_types", str("has ", t.size(), " entries for ", L, " layers (num_hidden_layers)"));
    for (int64_t i = 0; i < std::min<int64_t>(int64_t(t.size()), L + 1); ++i) {
      const std::string& s = t[size_t(i)];
      if (s == "sliding_attention") rates.push_back(0);
      else if (s == "compressed_sparse_attention") rates.push_back(rate_csa), csa[size_t(i)] = true;
      else if (s == "heavily_compressed_attention") rates.push_back(rate_hca);
      else f.bad("layer_types", str("entry ", i, " is '", s, "' (sliding_attention, compressed_sparse_attention or heavily_compressed_attention)"));
    }
  } else if (f.has("compress_ratios")) {
    const std::vector<int64_t> r = f.ints("compress_ratios");
    if (int64_t(r.size()) < L) f.bad("compress_ratios", str("has ", r.size(), " entries for ", L, " layers"));
    for (int64_t i = 0; i < std::min<int64_t>(int64_t(r.size()), L + 1); ++i) {
      const int64_t v = r[size_t(i)];
      if (v != 0 && v != 4 && v != 128) f.bad("compress_ratios", str("entry ", i, " is ", v, " (0, 4 or 128)"));
      rates.push_back(v == 0 ? 0 : v == 4 ? rate_csa : rate_hca);
      csa[size_t(i)] = v == 4;
    }
  } else {  // transformers' default: 2 HCA, then HCA / CSA interleaved
    for (int64_t i = 0; i < L; ++i) {
      const bool is_csa = i >= 2 && (i - 2) % 2 == 1;
      rates.push_back(is_csa ? rate_csa : rate_hca), csa[size_t(i)] = is_csa;
    }
  }

  // RoPE: "main" (sliding layers) and "compress" (the others; a flat YaRN dict is compress's)
  c->rope.style = c->rope_compress.style = RopeStyle::Interleaved;
  c->rope.theta = float(f.num({"rope_theta"}, 10000.0));
  c->rope_compress.theta = float(f.num({"compress_rope_theta"}, 160000.0));
  const int64_t max_pos = f.i64({"max_position_embeddings"}, 1048576);
  if (const char* key = f.pick({"rope_parameters", "rope_scaling"})) {
    const Fields rp = f.sub(key);
    if (rp.has("main") || rp.has("compress")) {
      if (rp.has("main")) parse_rope_params(rp.sub("main"), &c->rope, max_pos);
      if (rp.has("compress")) parse_rope_params(rp.sub("compress"), &c->rope_compress, max_pos);
    } else {
      const float theta = c->rope_compress.theta;
      parse_rope_params(rp, &c->rope_compress, max_pos);
      c->rope_compress.theta = theta;  // the flat dict's rope_theta is the main one's
    }
  }
  if (c->rope_compress.yarn && c->rope_compress.yarn_attention_factor < 0) c->rope_compress.yarn_attention_factor = 1.f;
  c->rope.partial_rotary_factor = c->rope_compress.partial_rotary_factor = float(prf);

  c->hc_mult = f.i64({"hc_mult"}, 4);
  c->hc_eps = float(f.num({"hc_eps"}, 1e-6));
  c->hc_sinkhorn_iters = f.i64({"hc_sinkhorn_iters"}, 20);
  if (c->hc_mult < 1 || c->hc_sinkhorn_iters < 1)
    f.bad("hc_mult", str("hc_mult ", c->hc_mult, " and hc_sinkhorn_iters ", c->hc_sinkhorn_iters, " must be >= 1"));
  c->hc_head_weighted = true;
  c->swiglu_limit = float(f.num({"swiglu_limit"}, 10.0));
  if (c->swiglu_limit < 0) f.bad("swiglu_limit", "must not be negative");

  parse_deepseek_moe(f, c, DeepseekMoeDefaults{0, 256, 1, 1});
  c->num_experts_per_tok = f.i64({"num_experts_per_tok"}, 6);
  c->routed_scaling_factor = float(f.num({"routed_scaling_factor"}, 1.5));
  c->intermediate_size = c->moe_intermediate_size;
  const std::string sf = f.string({"scoring_func"}, "sqrtsoftplus");
  if (sf == "sqrtsoftplus") c->score_func = ScoreFunc::SqrtSoftplus;
  else if (sf == "softmax") c->score_func = ScoreFunc::Softmax;
  else if (sf == "sigmoid") c->score_func = ScoreFunc::Sigmoid;
  else f.bad("scoring_func", str("'", sf, "' is not supported (sqrtsoftplus, softmax or sigmoid)"));
  c->norm_topk_prob = true;  // DeepSeek-V4's routers always renormalise
  c->router_correction_bias = true;
  std::vector<bool> hash(size_t(L), false);
  if (f.has("mlp_layer_types")) {
    const std::vector<std::string> t = f.strings("mlp_layer_types");
    if (int64_t(t.size()) < L) f.bad("mlp_layer_types", str("has ", t.size(), " entries for ", L, " layers"));
    for (int64_t i = 0; i < L; ++i) {
      if (t[size_t(i)] != "hash_moe" && t[size_t(i)] != "moe")
        f.bad("mlp_layer_types", str("entry ", i, " is '", t[size_t(i)], "' (hash_moe or moe)"));
      hash[size_t(i)] = t[size_t(i)] == "hash_moe";
    }
  } else {
    const int64_t nh = f.i64({"num_hash_layers"}, 3);
    for (int64_t i = 0; i < L; ++i) hash[size_t(i)] = i < nh;
  }
  c->mtp_layers = f.i64({"num_nextn_predict_layers"}, 0);
  if (int64_t(rates.size()) > L) c->mtp_compress_rate = rates[size_t(L)], c->mtp_csa = csa[size_t(L)];
  for (int64_t i = 0; i < L; ++i) {
    LayerSpec& l = c->layers[size_t(i)];
    l.mixer = MixerKind::DSV4;
    l.compress_rate = rates[size_t(i)];
    l.has_indexer = csa[size_t(i)];
    l.ffn = FfnKind::MoE;
    l.hash_moe = hash[size_t(i)];
  }
}

void validate_at(const ModelConfig& m, const std::string& where);

// quantization_config, any family: DeepSeek's block-scaled FP8 (quant_method "fp8": the weights say
// it, X.weight_scale_inv beside E4M3 X.weight) and compressed-tensors MXFP4 (Kimi K3). Anything else
// changes what the weights mean and is refused by name.
void parse_quantization(const Fields& f, ModelConfig* c) {
  if (!f.has("quantization_config")) return;
  const Fields q = f.sub("quantization_config");
  const std::string method = q.string({"quant_method"}, "");
  if (method == "fp8") return;
  if (method != "compressed-tensors")
    q.bad("quant_method", str("'", method, "' is not supported (fp8 block-scaled, or compressed-tensors ",
                             "mxfp4-pack-quantized)"));
  // The format at the top level or per config group (K3 writes it in config_groups.group_0).
  std::string format = q.string({"format"}, "");
  if (q.has("config_groups")) {
    const Fields groups = q.sub("config_groups");
    for (const auto& g : groups.object().items()) {
      const Fields gf = groups.sub(g.key().c_str());
      const std::string gfmt = gf.string({"format"}, format);
      if (format.empty()) format = gfmt;
      if (gfmt != format) gf.bad("format", str("'", gfmt, "' differs from '", format, "' (one format per checkpoint)"));
      if (gf.has("input_activations"))
        gf.bad("input_activations", "are quantised: activation quantisation in the checkpoint is not supported");
      if (gf.has("weights")) {
        const Fields w = gf.sub("weights");
        if (w.i64({"num_bits"}, 4) != 4) w.bad("num_bits", str("is ", w.i64({"num_bits"}, 4), " (MXFP4: 4)"));
        if (w.i64({"group_size"}, 32) != 32) w.bad("group_size", str("is ", w.i64({"group_size"}, 32), " (MXFP4: 32)"));
        const std::string type = w.string({"type"}, "float");
        if (type != "float") w.bad("type", str("is '", type, "' (MXFP4: float)"));
        const std::string strat = w.string({"strategy"}, "group");
        if (strat != "group" && strat != "tensor_group")
          w.bad("strategy", str("is '", strat, "' (MXFP4: group)"));
      }
    }
  }
  if (format != "mxfp4-pack-quantized")
    q.bad("format", str("'", format, "' is not supported (compressed-tensors: mxfp4-pack-quantized)"));
  c->weights_mxfp4 = true;
}

// Multimodal wrappers scored on their text model: wrapper model_type -> the text_config's.
const std::map<std::string, std::string>& wrappers() {
  static const std::map<std::string, std::string> w = {
      {"qwen3_5_moe", "qwen3_5_moe_text"}, {"glm5_next", "glm5_next_text"}, {"kimi_k3", "kimi_linear"}};
  return w;
}

std::string supported_model_types() {
  std::string s =
      "kimi_linear, deepseek_v32, glm_moe_dsa, glm5_next_text, deepseek_v4, qwen3_next, qwen3_5_moe_text, dayzero_hybrid";
  for (const auto& kv : wrappers()) s += ", " + kv.first;
  return s;
}

ModelConfig parse_at(const nlohmann::json& j, const std::string& where);

// A wrapper's config: text_config parsed as the model, with the wrapper's own settings that the
// text model inherits (tie_word_embeddings, token ids) filled in where text_config lacks them.
ModelConfig parse_wrapper(const json& j, const std::string& mt, const std::string& where) {
  const std::string text_type = wrappers().at(mt);
  auto it = j.find("text_config");
  DZ_CHECK(it != j.end() && it->is_object(), where, ": ", mt, " is a multimodal wrapper and needs a text_config object");
  json t = *it;
  const std::string inner = t.value("model_type", text_type);
  DZ_CHECK(inner == text_type, where, ": text_config.model_type is '", inner, "' (", mt, " wraps ", text_type, ")");
  t["model_type"] = text_type;
  for (const char* k : {"tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "quantization_config"})
    if (!t.contains(k) && j.contains(k)) t[k] = j[k];
  ModelConfig c = parse_at(t, where + " (text_config)");
  c.wrapper_model_type = mt;
  c.has_vision = j.contains("vision_config") && !j["vision_config"].is_null();
  return c;
}

// from_json / from_file: WHERE (the file name) starts every error message.
ModelConfig parse_at(const nlohmann::json& j, const std::string& where) {
  DZ_CHECK(j.is_object(), where, ": not a JSON object");
  if (auto mt = j.find("model_type"); mt != j.end() && mt->is_string() && wrappers().count(mt->get<std::string>()))
    return parse_wrapper(j, mt->get<std::string>(), where);
  Fields f(j, where);
  const std::string mt = f.string({"model_type"}, "");
  if (mt.empty()) f.bad("model_type", "is missing");
  ModelConfig c;
  c.model_type = mt;
  c.raw = j;
  if (mt == "kimi_linear") {
    c.family = Family::KimiLinear;
    parse_kimi(f, j, &c, false);
  } else if (mt == "dayzero_hybrid" || mt == "dayzero") {
    c.family = Family::Dayzero;
    parse_kimi(f, j, &c, true);
  } else if (mt == "deepseek_v32" || mt == "glm_moe_dsa") {
    c.family = Family::DeepseekV32;
    parse_deepseek_v32(f, j, &c, mt == "glm_moe_dsa");
  } else if (mt == "glm5_next_text") {
    c.family = Family::Glm5Next;
    parse_glm5_next(f, j, &c);
  } else if (mt == "deepseek_v4") {
    c.family = Family::DeepseekV4;
    parse_deepseek_v4(f, j, &c);
  } else if (mt == "qwen3_next" || mt == "qwen3_5_moe_text") {
    c.family = Family::Qwen3Next;
    parse_qwen3_next(f, j, &c, mt == "qwen3_5_moe_text");
  } else {
    f.bad("model_type", str("'", mt, "' is not supported (", supported_model_types(), ")"));
  }
  parse_quantization(f, &c);
  validate_at(c, where);
  return c;
}

}  // namespace

ModelConfig ModelConfig::from_json(const nlohmann::json& j) { return parse_at(j, "config.json"); }

bool is_supported_model_type(const std::string& mt) {
  static const std::set<std::string> direct = {"kimi_linear", "dayzero_hybrid", "dayzero",          "deepseek_v32",
                                                "glm_moe_dsa", "qwen3_next",     "qwen3_5_moe_text", "glm5_next_text",
                                                "deepseek_v4"};
  return direct.count(mt) > 0 || wrappers().count(mt) > 0;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  DZ_CHECK(in.good(), "cannot read model config ", path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail(str(path, ": not valid JSON: ", e.what()));
  }
  return parse_at(j, path);
}

void ModelConfig::validate() const { validate_at(*this, "model config"); }

namespace {

void validate_at(const ModelConfig& m, const std::string& where) {
  // Field names as the family's config.json spells them.
  const bool kimi = m.family == Family::KimiLinear || m.family == Family::Dayzero;
  const char* f_experts = m.family == Family::DeepseekV32 ? "n_routed_experts" : "num_experts";
  const char* f_topk = kimi ? "num_experts_per_token" : "num_experts_per_tok";
  const char* f_group = kimi ? "num_expert_group" : "n_group";
  const char* f_shared = kimi ? "num_shared_experts" : "n_shared_experts";
  const char* f_la_h = kimi ? "linear_attn_config.num_heads" : "linear_num_key_heads";
  const char* f_la_vh = kimi ? "linear_attn_config.num_heads" : "linear_num_value_heads";
  const char* f_la_k = kimi ? "linear_attn_config.head_dim" : "linear_key_head_dim";
  const char* f_la_v = kimi ? "linear_attn_config.head_dim" : "linear_value_head_dim";
  const char* f_conv = kimi ? "linear_attn_config.short_conv_kernel_size" : "linear_conv_kernel_dim";
  auto need = [&](bool ok, const std::string& field, const std::string& why) {
    if (!ok) fail(str(where, ": field ", field, " ", why));
  };
  auto pos = [&](int64_t v, const char* field) { need(v > 0, field, str("must be positive, got ", v)); };
  pos(m.vocab_size, "vocab_size");
  pos(m.hidden_size, "hidden_size");
  pos(m.num_layers, "num_hidden_layers");
  need(int64_t(m.layers.size()) == m.num_layers, "num_hidden_layers",
       str("is ", m.num_layers, " but the layer list has ", m.layers.size(), " entries"));
  need(m.rms_norm_eps > 0.f, "rms_norm_eps", "must be positive");
  need(m.hidden_act == "silu" || (m.hidden_act == "situ" && m.situ_beta > 0.f), "hidden_act",
       str("'", m.hidden_act, "' is not supported (silu; situ in the Kimi family)"));
  need(m.moe_latent_size >= 0, "routed_expert_hidden_size", "must be >= 0");
  need(m.attn_res_block_size >= 0, "attn_res_block_size", "must be >= 0");
  for (int64_t id : {m.bos_token_id, m.eos_token_id, m.pad_token_id})
    need(id < m.vocab_size, "bos/eos/pad_token_id", str(id, " is outside the vocabulary of ", m.vocab_size));

  bool any[kMixerKinds] = {};
  bool any_moe = false, any_dense = false, any_indexer = false;
  for (const LayerSpec& l : m.layers) {
    any[int(l.mixer)] = true;
    (l.ffn == FfnKind::MoE ? any_moe : any_dense) = true;
    any_indexer |= l.has_indexer;
    need(!l.has_indexer || l.mixer == MixerKind::MLA || l.mixer == MixerKind::DSV4, "index_topk",
         "applies to MLA and DeepSeek-V4 layers only");
  }
  if (any[int(MixerKind::KDA)] || any[int(MixerKind::GDN)]) {
    pos(m.la_num_k_heads, f_la_h);
    pos(m.la_num_v_heads, f_la_vh);
    pos(m.la_head_k_dim, f_la_k);
    pos(m.la_head_v_dim, f_la_v);
    pos(m.la_conv_kernel, f_conv);
    need(m.la_num_v_heads % m.la_num_k_heads == 0, "linear_num_value_heads",
         str(m.la_num_v_heads, " is not a multiple of linear_num_key_heads ", m.la_num_k_heads));
  }
  if (any[int(MixerKind::KDA)])
    need(m.la_num_k_heads == m.la_num_v_heads && m.la_head_k_dim == m.la_head_v_dim, "linear_attn_config",
         "KDA needs equal key/value head counts and head dims");
  if (any[int(MixerKind::MLA)]) {
    pos(m.num_heads, "num_attention_heads");
    pos(m.kv_lora_rank, "kv_lora_rank");
    pos(m.v_head_dim, "v_head_dim");
    need(m.q_lora_rank >= 0, "q_lora_rank", "must be >= 0");
    need(m.qk_nope_head_dim >= 0 && m.qk_rope_head_dim >= 0 && m.qk_nope_head_dim + m.qk_rope_head_dim > 0,
         "qk_nope_head_dim",
         str("+ qk_rope_head_dim must be positive (", m.qk_nope_head_dim, " + ", m.qk_rope_head_dim, ")"));
    need(m.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", str("must be even, got ", m.qk_rope_head_dim));
  }
  if (any_indexer) {
    pos(m.index_n_heads, "index_n_heads");
    pos(m.index_head_dim, "index_head_dim");
    pos(m.index_topk, "index_topk");
    need(m.index_head_dim >= m.qk_rope_head_dim, "index_head_dim",
         str(m.index_head_dim, " is smaller than qk_rope_head_dim ", m.qk_rope_head_dim));
  }
  if (any[int(MixerKind::DSV4)]) {
    pos(m.num_heads, "num_attention_heads");
    pos(m.head_dim, "head_dim");
    pos(m.q_lora_rank, "q_lora_rank");
    pos(m.sliding_window, "sliding_window");
  }
  if (any[int(MixerKind::GQA)]) {
    pos(m.num_heads, "num_attention_heads");
    pos(m.num_kv_heads, "num_key_value_heads");
    pos(m.head_dim, "head_dim");
    need(m.num_heads % m.num_kv_heads == 0, "num_attention_heads",
         str(m.num_heads, " is not a multiple of num_key_value_heads ", m.num_kv_heads));
    const float rot = m.rope.partial_rotary_factor * float(m.head_dim);
    need(m.rope.partial_rotary_factor > 0.f && m.rope.partial_rotary_factor <= 1.f && rot == float(int64_t(rot)) &&
             int64_t(rot) % 2 == 0,
         "partial_rotary_factor",
         str(m.rope.partial_rotary_factor, " x head_dim ", m.head_dim, " is not an even integer"));
  }
  need(m.rope.theta > 0.f, "rope_theta", "must be positive");
  if (m.rope.yarn) need(m.rope.yarn_factor >= 1.f, "rope_scaling.factor", "must be >= 1");
  if (any_dense) pos(m.intermediate_size, "intermediate_size");
  if (any_moe) {
    pos(m.n_routed_experts, f_experts);
    need(m.num_experts_per_tok > 0 && m.num_experts_per_tok <= m.n_routed_experts, f_topk,
         str(m.num_experts_per_tok, " must be in 1..", m.n_routed_experts));
    pos(m.moe_intermediate_size, "moe_intermediate_size");
    need(m.n_shared_experts >= 0 && m.shared_intermediate_size >= 0, f_shared, "must be >= 0");
    need(m.n_shared_experts == 0 || m.shared_intermediate_size > 0, "shared_expert_intermediate_size",
         "must be positive");
    pos(m.n_group, f_group);
    need(m.n_routed_experts % m.n_group == 0, f_group,
         str(m.n_group, " does not divide the ", m.n_routed_experts, " routed experts"));
    need(m.topk_group >= 1 && m.topk_group <= m.n_group, "topk_group", str(m.topk_group, " must be in 1..", m.n_group));
    // grouped selection takes the best 2 experts of each group, then top-k among the kept groups
    need(m.n_group == 1 || m.n_routed_experts / m.n_group >= 2, f_group, "leaves fewer than 2 experts per group");
    need(m.num_experts_per_tok <= m.topk_group * (m.n_routed_experts / m.n_group), f_topk,
         "exceeds the experts in topk_group groups");
  }
}

}  // namespace

nlohmann::json ModelConfig::to_json() const {
  json j;
  j["family"] = to_string(family);
  j["model_type"] = model_type;
  if (!wrapper_model_type.empty()) j["wrapper"] = {{"model_type", wrapper_model_type}, {"vision_tower", has_vision}};
  if (mtp_layers > 0) j["mtp_layers"] = mtp_layers;
  if (mtp_layers > 0 && family == Family::DeepseekV4)  // the MTP block's attention
    j["mtp_attention"] = mtp_compress_rate == 0 ? "sliding" : str(mtp_csa ? "csa " : "hca ", mtp_compress_rate);
  if (gdn_split_proj) j["gdn_split_proj"] = true;
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["num_layers"] = num_layers;
  j["rms_norm_eps"] = rms_norm_eps;
  j["norm_zero_centered"] = norm_zero_centered;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["pad_token_id"] = pad_token_id;
  json ls = json::array();
  for (const LayerSpec& l : layers)
    ls.push_back({{"mixer", to_string(l.mixer)}, {"ffn", to_string(l.ffn)},
                  {"indexer", l.shared_indexer ? json("shared") : json(l.has_indexer)}});
  j["layers"] = ls;
  bool any[kMixerKinds] = {};
  bool any_moe = false;
  for (const LayerSpec& l : layers) any[int(l.mixer)] = true, any_moe |= l.ffn == FfnKind::MoE;
  if (any[int(MixerKind::DSV4)]) {
    auto rj = [](const RopeConfig& r) {
      json o = {{"theta", r.theta}, {"style", "interleaved"}};
      if (r.yarn) o["yarn"] = {{"factor", r.yarn_factor}, {"original_max_position_embeddings", r.yarn_original_max_pos},
                               {"attention_factor", r.yarn_attention_factor}};
      return o;
    };
    j["dsv4"] = {{"num_heads", num_heads}, {"head_dim", head_dim}, {"q_lora_rank", q_lora_rank},
                 {"rope_dims", qk_rope_head_dim}, {"sliding_window", sliding_window}, {"o_groups", o_groups},
                 {"o_lora_rank", o_lora_rank}, {"rope_main", rj(rope)}, {"rope_compress", rj(rope_compress)},
                 {"indexer", {{"n_heads", index_n_heads}, {"head_dim", index_head_dim}, {"topk", index_topk}}}};
    json cr = json::array(), hs = json::array();
    for (const LayerSpec& l : layers) cr.push_back(l.compress_rate), hs.push_back(l.hash_moe);
    j["dsv4"]["compress_rates"] = cr;
    j["moe_hash_layers"] = hs;
  }
  if (hc_mult > 0) j["hc"] = {{"mult", hc_mult}, {"sinkhorn_iters", hc_sinkhorn_iters}, {"head", hc_head_weighted ? "weighted" : "mean"}};
  if (any[int(MixerKind::KDA)] || any[int(MixerKind::GDN)]) {
    j["linear_attention"] = {{"num_k_heads", la_num_k_heads}, {"num_v_heads", la_num_v_heads},
                             {"head_k_dim", la_head_k_dim},   {"head_v_dim", la_head_v_dim},
                             {"conv_kernel", la_conv_kernel}};
    if (any[int(MixerKind::KDA)]) {
      j["linear_attention"]["gate"] = kda_gate == KdaGate::Softplus ? "softplus" : "lower_bound_sigmoid";
      if (kda_gate == KdaGate::LowerBoundSigmoid) j["linear_attention"]["lower_bound"] = kda_gate_lower_bound;
      j["linear_attention"]["output_gate"] = kda_full_rank_gate ? "full_rank" : "low_rank";
    }
  }
  if (any[int(MixerKind::MLA)]) {
    j["mla"] = {{"num_heads", num_heads},         {"q_lora_rank", q_lora_rank},
                {"kv_lora_rank", kv_lora_rank},   {"qk_nope_head_dim", qk_nope_head_dim},
                {"qk_rope_head_dim", qk_rope_head_dim}, {"v_head_dim", v_head_dim},
                {"output_gate", mla_output_gate}};
    if (index_topk > 0)
      j["indexer"] = {{"n_heads", index_n_heads}, {"head_dim", index_head_dim}, {"topk", index_topk},
                      {"rope", index_rope_style == RopeStyle::NeoX ? "neox" : "interleaved"}};
  }
  if (any[int(MixerKind::GQA)])
    j["gqa"] = {{"num_heads", num_heads}, {"num_kv_heads", num_kv_heads}, {"head_dim", head_dim},
                {"output_gate", attn_output_gate}};
  if (any[int(MixerKind::MLA)] || any[int(MixerKind::GQA)]) {
    json r = {{"theta", rope.theta},
              {"style", rope.style == RopeStyle::NeoX ? "neox" : "interleaved"},
              {"partial_rotary_factor", rope.partial_rotary_factor}};
    if (rope.yarn)
      r["yarn"] = {{"factor", rope.yarn_factor},       {"original_max_position_embeddings", rope.yarn_original_max_pos},
                   {"beta_fast", rope.yarn_beta_fast}, {"beta_slow", rope.yarn_beta_slow},
                   {"mscale", rope.yarn_mscale},       {"mscale_all_dim", rope.yarn_mscale_all_dim}};
    j["rope"] = r;
  }
  j["ffn"] = {{"hidden_act", hidden_act}, {"intermediate_size", intermediate_size}};
  if (situ_beta > 0.f) j["ffn"]["situ"] = {{"beta", situ_beta}, {"linear_beta", situ_linear_beta}};
  if (swiglu_limit > 0.f) j["ffn"]["swiglu_limit"] = swiglu_limit;
  if (weights_mxfp4) j["quantization"] = "compressed-tensors mxfp4-pack-quantized";
  if (any_moe)
    j["moe"] = {{"n_routed_experts", n_routed_experts},
                {"num_experts_per_tok", num_experts_per_tok},
                {"moe_intermediate_size", moe_intermediate_size},
                {"n_shared_experts", n_shared_experts},
                {"shared_intermediate_size", shared_intermediate_size},
                {"shared_expert_gate", shared_expert_gate},
                {"score_func", score_func == ScoreFunc::Softmax  ? "softmax"
                                : score_func == ScoreFunc::Sigmoid ? "sigmoid"
                                                                   : "sqrtsoftplus"},
                {"norm_topk_prob", norm_topk_prob},
                {"routed_scaling_factor", routed_scaling_factor},
                {"n_group", n_group},
                {"topk_group", topk_group},
                {"router_correction_bias", router_correction_bias}};
  if (any_moe && moe_latent_size > 0) j["moe"]["latent"] = {{"size", moe_latent_size}, {"norm", moe_latent_norm}};
  j["attn_res_block_size"] = attn_res_block_size;
  return j;
}

}  // namespace dz
