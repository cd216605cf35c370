// `dayzero inspect`: the structural diff of the seed's Day-0 method. Every module of a checkpoint
// is classified against what dayzero implements:
//   reusable                            same module and same parameters as a model already adapted
//   reusable with different parameters  a module we implement, parameterised differently
//   new                                 the config or the tensors name something we do not implement
// A family with no config parser gets the structural diff from its tensors and keys alone
// (inspect_structural.cpp); --structural forces that for a supported family too.
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/model_config.hpp"
#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "job/inspect_structural.hpp"
#include "job/tools.hpp"
#include "model/attn_res.hpp"
#include "model/model.hpp"
#include "model/mtp.hpp"
#include "model/module.hpp"

namespace dz {

namespace {

struct Row {
  std::string where, module, kind, params, status, note;
};

// Parameterisations of models already adapted (their published configs).
const std::map<std::string, std::string>& known_modules() {
  static const std::map<std::string, std::string> k = {
      {"KDA heads=32 k=128 v=128 conv=4 gate=softplus", "Kimi-Linear-48B-A3B"},
      {"MLA heads=32 q_lora=0 kv_lora=512 nope=128 rope=64 v=128 out_gate=0 indexer=none", "Kimi-Linear-48B-A3B"},
      {"MLA heads=128 q_lora=1536 kv_lora=512 nope=128 rope=64 v=128 out_gate=0 indexer=64x128/top2048",
       "DeepSeek-V3.2"},
      {"GDN k_heads=16 v_heads=32 k=128 v=128 conv=4", "Qwen3-Next-80B-A3B"},
      {"GQA heads=16 kv_heads=2 head_dim=256 rotary=0.25 out_gate=1", "Qwen3-Next-80B-A3B"},
      {"MoE experts=256 top=8 width=1024 shared=1x1024 score=sigmoid groups=1/1", "Kimi-Linear-48B-A3B"},
      {"MoE experts=256 top=8 width=2048 shared=1x2048 score=sigmoid groups=8/4", "DeepSeek-V3.2"},
      {"MoE experts=512 top=10 width=512 shared=1x512 score=softmax groups=1/1", "Qwen3-Next-80B-A3B"},
      {"KDA heads=96 k=128 v=128 conv=4 gate=lower_bound_sigmoid out_gate=full_rank", "Kimi K3"},
      {"MLA heads=96 q_lora=1536 kv_lora=512 nope=128 rope=64 v=128 out_gate=1 indexer=none", "Kimi K3"},
      {"MoE experts=896 top=16 width=3072 shared=2x3072 score=sigmoid groups=1/1 act=situ(4,25) latent=3584 mxfp4",
       "Kimi K3"},
      {"MLP width=33792 act=situ(4,25)", "Kimi K3"},
  };
  return k;
}

std::string mixer_signature(const ModelConfig& c, const LayerSpec& l) {
  switch (l.mixer) {
    case MixerKind::KDA:
      return str("KDA heads=", c.la_num_k_heads, " k=", c.la_head_k_dim, " v=", c.la_head_v_dim, " conv=",
                 c.la_conv_kernel, " gate=", c.kda_gate == KdaGate::Softplus ? "softplus" : "lower_bound_sigmoid",
                 c.kda_full_rank_gate ? " out_gate=full_rank" : "");
    case MixerKind::GDN:
      return str("GDN k_heads=", c.la_num_k_heads, " v_heads=", c.la_num_v_heads, " k=", c.la_head_k_dim,
                 " v=", c.la_head_v_dim, " conv=", c.la_conv_kernel);
    case MixerKind::MLA:
      return str("MLA heads=", c.num_heads, " q_lora=", c.q_lora_rank, " kv_lora=", c.kv_lora_rank,
                 " nope=", c.qk_nope_head_dim, " rope=", c.qk_rope_head_dim, " v=", c.v_head_dim,
                 " out_gate=", int(c.mla_output_gate), " indexer=",
                 !l.has_indexer     ? std::string("none")
                 : l.shared_indexer ? std::string("shared (the Top-K of the layer before)")
                                    : str(c.index_n_heads, "x", c.index_head_dim, "/top", c.index_topk));
    case MixerKind::GQA:
      return str("GQA heads=", c.num_heads, " kv_heads=", c.num_kv_heads, " head_dim=", c.head_dim,
                 " rotary=", c.rope.partial_rotary_factor, " out_gate=", int(c.attn_output_gate));
    case MixerKind::DSV4:
      return str("DSV4 heads=", c.num_heads, " head_dim=", c.head_dim, " q_lora=", c.q_lora_rank, " rope=",
                 c.qk_rope_head_dim, " window=", c.sliding_window, " compress=",
                 l.compress_rate == 0 ? std::string("none")
                 : l.has_indexer      ? str("CSA/", l.compress_rate, " indexer=", c.index_n_heads, "x", c.index_head_dim,
                                            "/top", c.index_topk)
                                      : str("HCA/", l.compress_rate),
                 " out_groups=", c.o_groups, "x", c.o_lora_rank);
  }
  return "?";
}

// The gate activation as the signatures print it: silu, situ(beta,linear_beta), silu clamp=L.
std::string act_signature(const ModelConfig& c) {
  if (c.hidden_act == "situ") return str("situ(", c.situ_beta, ",", c.situ_linear_beta, ")");
  return c.swiglu_limit > 0.f ? str(c.hidden_act, " clamp=", c.swiglu_limit) : c.hidden_act;
}

std::string ffn_signature(const ModelConfig& c, const LayerSpec& l) {
  if (l.ffn == FfnKind::Dense) return str("MLP width=", c.intermediate_size, " act=", act_signature(c));
  int64_t per_shared = c.n_shared_experts > 0 ? c.shared_intermediate_size / c.n_shared_experts : 0;
  return str("MoE experts=", c.n_routed_experts, " top=", c.num_experts_per_tok, " width=", c.moe_intermediate_size,
             " shared=", c.n_shared_experts, "x", per_shared, " score=",
             c.score_func == ScoreFunc::Softmax   ? "softmax"
             : c.score_func == ScoreFunc::Sigmoid ? "sigmoid"
                                                  : "sqrtsoftplus",
             " groups=", c.n_group, "/", c.topk_group, l.hash_moe ? " hash" : "",
             c.hidden_act != "silu" || c.swiglu_limit > 0.f ? " act=" + act_signature(c) : std::string(),
             c.moe_latent_size > 0 ? str(" latent=", c.moe_latent_size, c.moe_latent_norm ? "" : "(no norm)") : std::string(),
             c.weights_mxfp4 ? " mxfp4" : "");
}

void classify(Row& r, const std::string& sig) {
  auto it = known_modules().find(sig);
  if (it != known_modules().end()) {
    r.status = "reusable";
    r.note = it->second;
  } else {
    r.status = "reusable with different parameters";
  }
}

// Which module of which layer an unexpected tensor belongs to.
std::string owner_of(const std::string& name, int64_t* layer) {
  *layer = -1;
  const std::string pre = "model.layers.";
  if (name.compare(0, pre.size(), pre) == 0) {
    size_t dot = name.find('.', pre.size());
    *layer = std::stoll(name.substr(pre.size(), dot - pre.size()));
    std::string rest = name.substr(dot + 1);
    if (rest.find("self_attn.") == 0 || rest.find("linear_attn.") == 0) return "token mixer";
    if (rest.find("mlp.") == 0 || rest.find("block_sparse_moe.") == 0) return "ffn";
    return "layer";
  }
  return "model";
}

}  // namespace

int inspect(const std::string& dir, bool as_json, bool structural) {
  std::vector<Row> rows;
  ModelConfig cfg;
  std::string family;
  // A family without a parser (or --structural): the diff from tensors and config keys alone.
  nlohmann::json raw;
  {
    std::ifstream in(dir + "/config.json");
    if (in.good()) raw = nlohmann::json::parse(in, nullptr, false);
  }
  const bool unknown_type = raw.is_object() && raw.contains("model_type") && raw["model_type"].is_string() &&
                            !is_supported_model_type(raw["model_type"].get<std::string>());
  if ((structural || unknown_type) && raw.is_object()) {
    try {
      for (auto& r : structural_diff(dir, raw, &family))
        rows.push_back({r.where, r.module, r.kind, r.params, r.status, r.evidence});
    } catch (const Error& e) {
      rows.push_back({"weights", "safetensors", "?", "", "new", e.what()});
    }
  } else {
    try {
      cfg = ModelConfig::from_file(dir + "/config.json");
      family = cfg.model_type + (cfg.wrapper_model_type.empty() ? "" : " (in " + cfg.wrapper_model_type + ")");
    } catch (const Error& e) {
      rows.push_back({"config", "config.json", "?", "", "new", e.what()});
    }
  }
  const bool parsed = !cfg.layers.empty();
  std::unique_ptr<Checkpoint> ck;
  if (rows.empty() && parsed) {
    try {
      ck = Checkpoint::open(dir);
    } catch (const Error& e) {
      rows.push_back({"weights", "safetensors", "?", "", "new", e.what()});
    }
  }
  if (ck) {
    const TextPackaging pk = adopt_text_model(cfg, *ck);
    infer_mtp_layers(cfg, *ck);
    ck->set_dry_run(true);  // names and shapes only: inspect must not need the model's memory
    const int64_t D = cfg.hidden_size, V = cfg.vocab_size;
    const Init ni = cfg.norm_zero_centered ? Init::zeros() : Init::ones();
    const bool v4 = cfg.family == Family::DeepseekV4;  // DeepSeek's own names: attn_norm / ffn_norm / head
    auto attempt = [&](Row r, const std::function<void()>& f) {
      try {
        f();
      } catch (const Error& e) {
        r.status = "new";
        r.note = e.what();
      }
      rows.push_back(r);
    };
    attempt({"model", "embedding", "embedding", str(V, "x", D), "reusable", ""},
            [&] { ck->get("model.embed_tokens.weight", {V, D}); });
    for (int64_t i = 0; i < cfg.num_layers; ++i) {
      const LayerSpec& ls = cfg.layers[size_t(i)];
      const std::string p = str("model.layers.", i, ".");
      if (cfg.hc_mult > 0)
        attempt({str("layer ", i), "residual", "mHC", str("streams=", cfg.hc_mult, " sinkhorn=", cfg.hc_sinkhorn_iters),
                 "reusable with different parameters", ""},
                [&] {
                  for (int w = 0; w < 2; ++w) get_hc_tensors(cfg, *ck, p, w);  // the names the loader accepts
                });
      Row m{str("layer ", i), "token mixer", to_string(ls.mixer), mixer_signature(cfg, ls), "", ""};
      classify(m, m.params);
      attempt(m, [&] {
        ck->get(p + (v4 ? "attn_norm.weight" : "input_layernorm.weight"), {D}, ni);
        switch (ls.mixer) {
          case MixerKind::KDA: make_kda_mixer(cfg, int(i), *ck, p); break;
          case MixerKind::GDN: make_gdn_mixer(cfg, int(i), *ck, p); break;
          case MixerKind::MLA: {
            TopkLink link;  // a shared-indexer layer takes its sets from an earlier layer
            if (ls.shared_indexer) link.take = make_topk_share();
            make_mla_mixer_linked(cfg, int(i), *ck, p, TpShard{}, cpu_backend(), link);
            break;
          }
          case MixerKind::GQA: make_gqa_mixer(cfg, int(i), *ck, p); break;
          case MixerKind::DSV4: make_dsv4_mixer(cfg, int(i), *ck, p); break;
        }
      });
      Row f{str("layer ", i), "ffn", to_string(ls.ffn), ffn_signature(cfg, ls), "", ""};
      if (ls.ffn == FfnKind::Dense)
        f.status = "reusable";
      else
        classify(f, f.params);
      attempt(f, [&] {
        ck->get(p + (v4 ? "ffn_norm.weight" : "post_attention_layernorm.weight"), {D}, ni);
        if (ls.ffn == FfnKind::MoE)
          make_moe_ffn(cfg, int(i), *ck, p);
        else
          make_mlp_ffn(cfg, int(i), *ck, p);
      });
    }
    if (cfg.attn_res_block_size > 0)
      attempt({"model", "residual", "Block AttnRes", str("block=", cfg.attn_res_block_size),
               cfg.attn_res_block_size == 12 ? "reusable" : "reusable with different parameters",
               cfg.attn_res_block_size == 12 ? "Kimi K3" : ""},
              [&] { AttnRes ar(cfg, *ck); });
    if (cfg.hc_head_weighted)
      attempt({"model", "hyper-connection head", "mHC (weighted)", str("streams=", cfg.hc_mult), "reusable", ""}, [&] {
        ck->get("model.hc_head.hc_fn", {cfg.hc_mult, cfg.hc_mult * D});
        ck->get("model.hc_head.hc_base", {cfg.hc_mult});
        ck->get("model.hc_head.hc_scale", {1});
      });
    attempt({"model", "final norm + LM head", "rmsnorm + linear", str(D, " -> ", V), "reusable", ""}, [&] {
      ck->get("model.norm.weight", {D}, ni);
      if (!cfg.tie_word_embeddings) ck->get(cfg.family == Family::DeepseekV4 ? "head.weight" : "lm_head.weight", {V, D});
    });
    if (cfg.mtp_layers > 0) {
      const int64_t k = skip_mtp_layers(cfg, *ck);
      rows.push_back({"model", "MTP layers", "speculative", str(cfg.mtp_layers, " layer(s), ", k, " tensors"), "reusable",
                      mtp_supported(cfg) ? "multi-token prediction: the first layer drafts for --speculative mtp"
                                         : "multi-token prediction: accepted, not run (no --speculative mtp for this family)"});
    }
    if (pk.vision_tensors > 0)
      rows.push_back({"model", "vision tower", "recognised, not loaded", str(pk.vision_tensors, " tensors"), "reusable",
                      str(cfg.wrapper_model_type, " is scored on its text model (under ", pk.prefix, ")")});
    // Tensors nobody asked for belong to modules we do not implement.
    std::map<std::pair<int64_t, std::string>, std::vector<std::string>> stray;
    for (const auto& n : ck->unused()) {
      int64_t layer;
      std::string mod = owner_of(n, &layer);
      stray[{layer, mod}].push_back(n);
    }
    for (auto& kv : stray) {
      std::string where = kv.first.first >= 0 ? str("layer ", kv.first.first) : std::string("model");
      bool found = false;
      for (auto& r : rows)
        if (r.where == where && r.module == kv.first.second) {
          r.status = "new";
          r.note = str("unexpected tensor ", kv.second[0],
                       kv.second.size() > 1 ? str(" (and ", kv.second.size() - 1, " more)") : std::string());
          found = true;
        }
      if (!found)
        rows.push_back({where, kv.first.second, "?", "", "new",
                        str("unexpected tensor ", kv.second[0],
                            kv.second.size() > 1 ? str(" (and ", kv.second.size() - 1, " more)") : std::string())});
    }
  }
  int n_re = 0, n_diff = 0, n_uns = 0;
  for (auto& r : rows) (r.status == "reusable" ? n_re : r.status == "new" ? n_uns : n_diff)++;
  if (as_json) {
    nlohmann::json j;
    j["model"] = dir;
    if (parsed) j["config"] = cfg.to_json();
    j["family"] = family;
    j["structural"] = !parsed;
    nlohmann::json arr = nlohmann::json::array();
    for (auto& r : rows)
      arr.push_back({{"where", r.where}, {"module", r.module}, {"kind", r.kind}, {"params", r.params},
                     {"status", r.status}, {"note", r.note}});
    j["modules"] = arr;
    j["summary"] = {{"reusable", n_re}, {"reusable_with_different_parameters", n_diff}, {"new", n_uns}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s: %s%s\n", dir.c_str(), family.empty() ? "?" : family.c_str(),
                parsed ? "" : " (structural diff from tensor names, shapes and config keys)");
    std::printf("%-9s %-21s %-15s %-34s %s\n", "where", "module", "kind", "status", "parameters / evidence");
    for (auto& r : rows)
      std::printf("%-9s %-21s %-15s %-34s %s%s%s\n", r.where.c_str(), r.module.c_str(), r.kind.c_str(),
                  r.status.c_str(), r.params.c_str(), r.note.empty() ? "" : "  # ", r.note.c_str());
    std::printf("summary: %zu modules: %d reusable, %d reusable with different parameters, %d new\n",
                rows.size(), n_re, n_diff, n_uns);
  }
  return n_uns > 0 ? 2 : 0;
}

}  // namespace dz
