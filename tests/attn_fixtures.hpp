// Shared by the attention mixer tests (unit and MPI): the factory signature, the layer prefix the
// tests build under, and the optional biases they add so TP must shard them (q/k/v) or add them
// once (o_proj).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "model/module.hpp"

namespace dzt {

using Factory = std::function<std::unique_ptr<dz::Mixer>(const dz::ModelConfig&, int, dz::Checkpoint&,
                                                         const std::string&, const dz::TpShard&)>;
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

}  // namespace dzt
