// Shared by the attention mixer tests (unit and MPI): the factory signature, the layer prefix the
// tests build under, the optional biases they add so TP must shard them (q/k/v) or add them once
// (o_proj), small MLA / GQA configurations, random weights written as a checkpoint, and inputs.
#pragma once
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"
#include "model/module.hpp"

namespace dzt {

using Factory = std::function<std::unique_ptr<dz::Mixer>(const dz::ModelConfig&, int, dz::Checkpoint&,
                                                         const std::string&, const dz::TpShard&, dz::Backend&)>;
inline const std::string kPrefix = "model.layers.0.";

// Optional biases, absent from make-model's minimal layout.
inline std::map<std::string, dz::Shape> biases(const dz::ModelConfig& c) {
  const std::string p = kPrefix + "self_attn.";
  if (c.num_kv_heads > 0)
    return {{p + "q_proj.bias", {c.num_heads * 2 * c.head_dim}},
            {p + "k_proj.bias", {c.num_kv_heads * c.head_dim}},
            {p + "v_proj.bias", {c.num_kv_heads * c.head_dim}},
            {p + "o_proj.bias", {c.hidden_size}}};
  return {{p + "kv_a_proj_with_mqa.bias", {c.kv_lora_rank + c.qk_rope_head_dim}}, {p + "o_proj.bias", {c.hidden_size}}};
}

// Writes O(1)-scaled random weights for every tensor the factory asks for (the 0.02 init would
// make every softmax nearly uniform and hide mistakes), plus the optional biases, into dir as
// safetensors. Deterministic in seed, so every MPI rank writes the same values.
inline void write_weights(const dz::ModelConfig& cfg, const Factory& make, uint32_t seed, const std::string& dir) {
  auto gen = dz::Checkpoint::random(seed);
  make(cfg, 0, *gen, kPrefix, dz::TpShard{}, dz::cpu_backend());
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::map<std::string, dz::Tensor> w;
  for (const auto& [name, t0] : gen->generated()) {
    dz::Tensor t(t0.shape);
    const bool norm_w = name.find("norm.weight") != std::string::npos;
    for (auto& v : t.data) {
      if (norm_w) v = 1.f + 0.3f * nd(g);
      else if (t.ndim() == 1) v = 0.3f * nd(g);  // LayerNorm / projection biases
      else v = 1.5f * nd(g) / std::sqrt(float(t.shape[1]));
    }
    w[name] = t;
  }
  for (const auto& [name, shape] : biases(cfg)) {
    dz::Tensor t(shape);
    for (auto& v : t.data) v = 0.3f * nd(g);
    w[name] = t;
  }
  dz::write_safetensors(dir, w, dz::DType::F32);
}

// The mixer from the checkpoint in dir (every tensor must be used).
inline std::unique_ptr<dz::Mixer> load(const dz::ModelConfig& cfg, const Factory& make, const std::string& dir,
                                       const dz::TpShard& tp) {
  auto ck = dz::Checkpoint::open(dir);
  auto m = make(cfg, 0, *ck, kPrefix, tp, dz::cpu_backend());
  ck->check_all_used();
  return m;
}

// One MLA layer: 4 heads, small odd dims; DSA indexer of 3 heads x 8 choosing topk keys; YaRN
// (factor 4 over yarn_orig positions) when asked.
inline dz::ModelConfig mla_cfg(dz::Family f, int64_t q_lora, bool gate, bool indexer, bool yarn, int64_t topk,
                               int64_t yarn_orig) {
  dz::ModelConfig c;
  c.family = f;
  c.hidden_size = 19;
  c.num_layers = 1;
  c.num_heads = 4;
  c.q_lora_rank = q_lora;
  c.kv_lora_rank = 9;
  c.qk_nope_head_dim = 5;
  c.qk_rope_head_dim = 4;
  c.v_head_dim = 7;
  c.mla_output_gate = gate;
  c.rope.theta = 50.f;
  c.index_n_heads = 3;
  c.index_head_dim = 8;
  c.index_topk = topk;
  if (yarn) {
    c.rope.yarn = true;
    c.rope.yarn_factor = 4.f;
    c.rope.yarn_original_max_pos = yarn_orig;
    c.rope.yarn_beta_fast = 32.f;
    c.rope.yarn_beta_slow = 1.f;
    c.rope.yarn_mscale = 1.f;
    c.rope.yarn_mscale_all_dim = 0.5f;
  }
  dz::LayerSpec ls;
  ls.mixer = dz::MixerKind::MLA;
  ls.has_indexer = indexer;
  c.layers = {ls};
  return c;
}

// One gated GQA layer (qwen3_next): 6 query heads in 2 groups of 3, partial NeoX rope.
inline dz::ModelConfig gqa_cfg() {
  dz::ModelConfig c;
  c.family = dz::Family::Qwen3Next;
  c.hidden_size = 19;
  c.num_layers = 1;
  c.num_heads = 6;
  c.num_kv_heads = 2;  // groups of 3; T = 2 puts one KV head and its 3 query heads on each rank
  c.head_dim = 8;
  c.attn_output_gate = true;
  c.norm_zero_centered = true;
  c.rms_norm_eps = 1e-6f;
  c.rope.theta = 50.f;
  c.rope.partial_rotary_factor = 0.5f;
  dz::LayerSpec ls;
  ls.mixer = dz::MixerKind::GQA;
  c.layers = {ls};
  return c;
}

// x [T, D] ~ N(0, 1), deterministic in seed.
inline std::vector<float> rand_x(int64_t T, int64_t D, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(T * D));
  for (auto& v : x) v = nd(g);
  return x;
}

}  // namespace dzt
