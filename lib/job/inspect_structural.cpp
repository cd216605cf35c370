// `dayzero inspect` on a family dayzero has no config parser for: the seed's structural diff from
// config.json keys and tensor names and shapes alone. Each layer's tensors are grouped by module
// (self_attn., linear_attn., mlp., block_sparse_moe., the layer's own tensors) and matched against
// the tensor fingerprints of the modules dayzero implements; parameters are read off the shapes.
//   reusable                            a dayzero module, with the parameters of a model already adapted
//   reusable with different parameters  a dayzero module, parameterised differently
//   new                                 tensors no dayzero module accounts for, or config keys dayzero
//                                       does not read (their names and values are the evidence)
#include "job/inspect_structural.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "config/model_config.hpp"
#include "core/error.hpp"
#include "io/checkpoint.hpp"

namespace dz {

namespace {

using json = nlohmann::json;
using Names = std::map<std::string, Shape>;  // tensor name (relative to its module) -> shape

// Config keys some dayzero parser reads (lib/config/model_config.cpp), and keys every Hugging Face
// config carries that change nothing in a forward pass.
const std::set<std::string>& known_keys() {
  static const std::set<std::string> k = {
      // read by dayzero's parsers
      "attn_res_block_size", "decoder_sparse_step", "dense_ffn_hidden", "first_k_dense_replace",
      "forget_gate_lower_bound", "full_attention_interval", "full_attn_layers", "gate_lower_bound", "head_dim",
      "hidden_act", "hidden_size", "index_head_dim", "index_n_heads", "index_skip_topk_offset", "index_topk",
      "index_topk_freq", "index_topk_pattern", "indexer_types", "intermediate_size", "kda_gate_lower_bound",
      "kda_layers", "kv_lora_rank", "latent_moe_use_norm", "layer_types", "linear_attn_config",
      "linear_conv_kernel_dim", "linear_head_dim", "linear_key_head_dim", "linear_num_heads", "linear_num_key_heads",
      "linear_num_value_heads", "linear_value_head_dim", "linear_lower_bound", "max_position_embeddings",
      "mla_use_output_gate", "mla_use_nope", "mlp_layer_types", "mlp_only_layers", "model_type",
      "moe_intermediate_size", "moe_layer_freq", "moe_renormalize", "moe_router_activation_func",
      "mtp_num_hidden_layers", "n_group", "n_routed_experts", "n_shared_experts", "norm_topk_prob",
      "num_attention_heads", "num_expert_group", "num_experts", "num_experts_per_tok", "num_experts_per_token",
      "num_heads", "num_hidden_layers", "num_key_value_heads", "num_local_experts", "num_nextn_predict_layers",
      "num_shared_experts", "partial_rotary_factor", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
      "rms_norm_eps", "rope_interleave", "rope_parameters", "rope_scaling", "rope_theta", "routed_expert_hidden_size",
      "routed_scaling_factor", "scoring_func", "shared_expert_intermediate_size", "short_conv_kernel_size",
      "tie_word_embeddings", "topk_group", "topk_method", "use_full_rank_gate", "use_grouped_topk", "v_head_dim",
      "vocab_size", "qk_head_dim", "hc_mult", "hc_eps", "hc_sinkhorn_iters", "swiglu_limit", "index_kpool",
      "index_kpool_always_select_tail", "compress_rates", "compress_ratios", "compress_rate_csa", "compress_rate_hca",
      "compress_rope_theta", "sliding_window", "o_groups", "o_lora_rank", "num_hash_layers",
      "activation_situ_beta", "activation_situ_linear_beta", "quantization_config",
      // generic: bookkeeping, training-only, special tokens, the wrapper's own
      "architectures", "auto_map", "dtype", "torch_dtype", "transformers_version", "use_cache", "initializer_range",
      "attention_dropout", "attention_bias", "mlp_bias", "output_router_logits", "router_aux_loss_coef",
      "aux_loss_alpha", "seq_aux", "ep_size", "bos_token_id", "eos_token_id", "pad_token_id", "text_config",
      "vision_config", "image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id",
      "image_start_token_id", "image_end_token_id", "video_start_token_id", "video_end_token_id",
      "media_placeholder_token_id",
      "tie_encoder_decoder", "is_encoder_decoder", "return_dict", "output_hidden_states", "output_attentions",
      "chunk_size_feed_forward", "pretraining_tp", "id2label", "label2id", "problem_type", "name_or_path",
      "keys_to_ignore_at_inference", "base_config_key", "sub_configs", "model_max_length", "max_window_layers",
      "router_jitter_noise"};
  return k;
}

struct Module {
  std::string where, module, kind, params, status, evidence;
};

bool has(const Names& n, const std::string& k) { return n.count(k) > 0; }
int64_t dim(const Names& n, const std::string& k, size_t i) {
  auto it = n.find(k);
  return it != n.end() && it->second.size() > i ? it->second[i] : -1;
}
int64_t count(const Names& n, const std::string& k) {
  auto it = n.find(k);
  return it == n.end() ? -1 : numel(it->second);
}

// One fingerprint: the names it needs (any alternative of each group), the names it may have.
struct Fingerprint {
  std::string kind;
  std::vector<std::vector<std::vector<std::string>>> need;  // groups of alternatives, each a set of names
  std::vector<std::string> optional_prefixes;               // names starting with these are its too
  std::function<std::string(const Names&, const json&)> params;
};

// The names a fingerprint accounts for in `n`, or empty when a needed group is missing.
std::set<std::string> match(const Fingerprint& f, const Names& n) {
  std::set<std::string> got;
  for (const auto& group : f.need) {
    bool ok = false;
    for (const auto& alt : group) {
      if (std::all_of(alt.begin(), alt.end(), [&](const std::string& s) { return has(n, s); })) {
        got.insert(alt.begin(), alt.end());
        ok = true;
        break;
      }
    }
    if (!ok) return {};
  }
  for (const auto& kv : n)
    for (const auto& p : f.optional_prefixes)
      if (kv.first.rfind(p, 0) == 0) got.insert(kv.first);
  return got;
}

int64_t ji(const json& c, const char* k, int64_t d = -1) {
  auto it = c.find(k);
  return it != c.end() && it->is_number_integer() ? it->get<int64_t>() : d;
}

const std::vector<Fingerprint>& mixers() {
  static const std::vector<Fingerprint> f = {
      {"MLA",
       {{{"kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight"}},
        {{"q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"}, {"q_proj.weight"}}},
       {"kv_a_proj_with_mqa.bias", "o_proj.bias", "q_a_proj.bias", "g_proj.weight", "indexer.wq_b.weight",
        "indexer.wk.weight", "indexer.k_norm.", "indexer.weights_proj.weight", "indexer.index_kpool_compress_ape",
        "indexer.index_kpool_compress_gate"},
       [](const Names& n, const json& c) {
         const int64_t R = count(n, "kv_a_layernorm.weight"), rope = dim(n, "kv_a_proj_with_mqa.weight", 0) - R;
         const int64_t H = ji(c, "num_attention_heads"), qb = has(n, "q_b_proj.weight") ? dim(n, "q_b_proj.weight", 0)
                                                                                         : dim(n, "q_proj.weight", 0);
         const int64_t v = H > 0 ? dim(n, "o_proj.weight", 1) / H : -1, qk = H > 0 ? qb / H : -1;
         std::string s = str("MLA heads=", H, " q_lora=", has(n, "q_a_proj.weight") ? dim(n, "q_a_proj.weight", 0) : 0,
                             " kv_lora=", R, " nope=", qk - rope, " rope=", rope, " v=", v,
                             " out_gate=", int(has(n, "g_proj.weight")));
         if (has(n, "indexer.wk.weight"))
           s += str(" indexer=", dim(n, "indexer.weights_proj.weight", 0), "x", dim(n, "indexer.wk.weight", 0), "/top",
                    ji(c, "index_topk"));
         if (has(n, "indexer.index_kpool_compress_ape")) s += str(" kpool=", dim(n, "indexer.index_kpool_compress_ape", 0));
         return s;
       }},
      {"DSV4",
       {{{"wq_a.weight", "q_norm.weight", "wq_b.weight", "wkv.weight", "norm.weight", "wo_a.weight", "wo_b.weight",
          "attn_sink"}}},
       {"compressor.wkv.weight", "compressor.wgate.weight", "compressor.ape", "compressor.norm.weight",
        "indexer.compressor.", "indexer.wq_b.weight", "indexer.weights_proj.weight"},
       [](const Names& n, const json& c) {
         const int64_t H = ji(c, "num_attention_heads"), D = count(n, "norm.weight");
         std::string s = str("DSV4 heads=", H, " head_dim=", D, " q_lora=", dim(n, "wq_a.weight", 0),
                             " out_groups=", H > 0 && D > 0 ? (H * D) / std::max<int64_t>(dim(n, "wo_a.weight", 1), 1) : -1,
                             "x", H > 0 ? dim(n, "wo_a.weight", 0) / std::max<int64_t>((H * D) / std::max<int64_t>(dim(n, "wo_a.weight", 1), 1), 1) : -1);
         if (has(n, "compressor.ape"))
           s += str(has(n, "indexer.wq_b.weight") ? " CSA/" : " HCA/", dim(n, "compressor.ape", 0));
         if (has(n, "indexer.wq_b.weight"))
           s += str(" indexer=", dim(n, "indexer.weights_proj.weight", 0), "x",
                    count(n, "indexer.compressor.norm.weight"), "/top", ji(c, "index_topk"));
         return s;
       }},
      {"KDA",
       {{{"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "b_proj.weight", "o_norm.weight"}},
        {{"g_a_proj.weight", "g_b_proj.weight"}, {"g_proj.weight"}},  // output gate: low rank, or K3's full rank
        {{"f_a_proj.weight", "f_b_proj.weight", "A_log", "dt_bias"},
         {"forget_gate.f_a_proj.weight", "forget_gate.f_b_proj.weight", "forget_gate.A_log", "forget_gate.dt_bias"}},
        {{"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"}, {"conv1d.weight"}}},
       {},
       [](const Names& n, const json&) {
         const int64_t K = count(n, "o_norm.weight"), HK = dim(n, "q_proj.weight", 0);
         const std::string cv = has(n, "q_conv1d.weight") ? "q_conv1d.weight" : "conv1d.weight";
         auto it = n.find(cv);
         return str("KDA heads=", K > 0 ? HK / K : -1, " k=", K, " v=", K, " conv=", it->second.back(),
                    has(n, "g_proj.weight") ? " out_gate=full_rank" : "");
       }},
      {"GDN",
       {{{"conv1d.weight", "A_log", "dt_bias", "norm.weight", "out_proj.weight"}},
        {{"in_proj_qkvz.weight", "in_proj_ba.weight"},
         {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"}}},
       {},
       [](const Names& n, const json&) {
         const int64_t HV = count(n, "A_log"), V = count(n, "norm.weight");
         const int64_t qk = has(n, "in_proj_qkv.weight") ? dim(n, "in_proj_qkv.weight", 0) - HV * V
                                                         : dim(n, "in_proj_qkvz.weight", 0) - 2 * HV * V;
         return str("GDN v_heads=", HV, " v=", V, " qk_width=", qk / 2, " conv=", n.at("conv1d.weight").back(),
                    has(n, "in_proj_qkv.weight") ? " projections=split" : " projections=fused");
       }},
      {"GQA",
       {{{"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "q_norm.weight", "k_norm.weight"}}},
       {"q_proj.bias", "k_proj.bias", "v_proj.bias"},
       [](const Names& n, const json&) {
         const int64_t hd = count(n, "q_norm.weight"), kv = dim(n, "k_proj.weight", 0) / hd,
                       h = dim(n, "o_proj.weight", 1) / hd;
         return str("GQA heads=", h, " kv_heads=", kv, " head_dim=", hd,
                    " out_gate=", int(dim(n, "q_proj.weight", 0) == 2 * h * hd));
       }},
  };
  return f;
}

const std::vector<Fingerprint>& ffns() {
  static const std::vector<Fingerprint> f = {
      {"MoE",
       {{{"gate.weight"}},
        {{"experts.0.w1.weight", "experts.0.w2.weight", "experts.0.w3.weight"},
         {"experts.0.gate_proj.weight", "experts.0.up_proj.weight", "experts.0.down_proj.weight"},
         {"experts.gate_up_proj", "experts.down_proj"}}},
       {"experts.", "gate.e_score_correction_bias", "e_score_correction_bias", "gate.bias", "shared_experts.",
        "shared_expert.", "shared_expert_gate.weight", "gate.tid2eid", "routed_expert_down_proj.weight",
        "routed_expert_up_proj.weight", "routed_expert_norm.weight"},
       [](const Names& n, const json&) {
         const int64_t E = dim(n, "gate.weight", 0);
         int64_t w = has(n, "experts.0.w1.weight")          ? dim(n, "experts.0.w1.weight", 0)
                     : has(n, "experts.0.gate_proj.weight") ? dim(n, "experts.0.gate_proj.weight", 0)
                                                            : dim(n, "experts.gate_up_proj", 1) / 2;
         std::string sh = "shared_expert.gate_proj.weight";
         for (const char* k : {"shared_experts.gate_proj.weight", "shared_experts.w1.weight"})
           if (has(n, k)) sh = k;
         return str("MoE experts=", E, " width=", w, " shared_width=", has(n, sh) ? dim(n, sh, 0) : 0, " correction_bias=",
                    int(has(n, "gate.e_score_correction_bias") || has(n, "e_score_correction_bias") || has(n, "gate.bias")),
                    " shared_gate=", int(has(n, "shared_expert_gate.weight")),
                    has(n, "gate.tid2eid") ? " hash_routed=1" : "",
                    // K3's latent MoE: experts on down(x) [L], back through up(RMSNorm(.))
                    has(n, "routed_expert_down_proj.weight") ? str(" latent=", dim(n, "routed_expert_down_proj.weight", 0))
                                                             : std::string());
       }},
      {"MLP",
       {{{"gate_proj.weight", "up_proj.weight", "down_proj.weight"}}},
       {},
       [](const Names& n, const json&) { return str("MLP width=", dim(n, "gate_proj.weight", 0)); }},
  };
  return f;
}

// Shape-read parameters of modules of models already adapted (Kimi-Linear-48B-A3B, DeepSeek-V3.2,
// Qwen3-Next-80B-A3B), as the fingerprints above print them.
const std::map<std::string, std::string>& adapted() {
  static const std::map<std::string, std::string> k = {
      {"KDA heads=32 k=128 v=128 conv=4", "Kimi-Linear-48B-A3B"},
      {"MLA heads=32 q_lora=0 kv_lora=512 nope=128 rope=64 v=128 out_gate=0", "Kimi-Linear-48B-A3B"},
      {"MLA heads=128 q_lora=1536 kv_lora=512 nope=128 rope=64 v=128 out_gate=0 indexer=64x128/top2048",
       "DeepSeek-V3.2"},
      {"GDN v_heads=32 v=128 qk_width=2048 conv=4 projections=fused", "Qwen3-Next-80B-A3B"},
      {"GQA heads=16 kv_heads=2 head_dim=256 out_gate=1", "Qwen3-Next-80B-A3B"},
      {"MoE experts=256 width=1024 shared_width=1024 correction_bias=1 shared_gate=0", "Kimi-Linear-48B-A3B"},
      {"MoE experts=256 width=2048 shared_width=2048 correction_bias=1 shared_gate=0", "DeepSeek-V3.2"},
      {"MoE experts=512 width=512 shared_width=512 correction_bias=0 shared_gate=1", "Qwen3-Next-80B-A3B"},
      {"KDA heads=96 k=128 v=128 conv=4 out_gate=full_rank", "Kimi K3"},
      {"MLA heads=96 q_lora=1536 kv_lora=512 nope=128 rope=64 v=128 out_gate=1", "Kimi K3"},
      {"MoE experts=896 width=3072 shared_width=6144 correction_bias=1 shared_gate=0 latent=3584 mxfp4", "Kimi K3"},
  };
  return k;
}

std::string list(const std::vector<std::string>& v, size_t most = 4);

// A layer's mHC tensors: dayzero's module when they are exactly hc_{attn,ffn}_{fn,base,scale} with
// the shapes hc_mult implies ([(2+N)N, N·D], [(2+N)N], [3]).
Module hc_row(const std::string& where, const std::string& pre, const Names& n, const json& c) {
  const int64_t N = ji(c, "hc_mult", 0), D = ji(c, "hidden_size", 0), C = (2 + N) * N;
  std::vector<std::string> mine, other;
  for (const auto& kv : n) {
    if (kv.first.find("hc") == std::string::npos) continue;
    bool ok = false;
    for (const char* site : {"attn", "ffn"}) {
      const std::string b = str("hc_", site, "_");
      ok |= (kv.first == b + "fn" && kv.second == Shape{C, N * D}) || (kv.first == b + "base" && kv.second == Shape{C}) ||
            (kv.first == b + "scale" && kv.second == Shape{3});
    }
    (ok ? mine : other).push_back(pre + kv.first + " " + shape_str(kv.second));
  }
  if (!other.empty() || mine.size() != 6 || N < 1)
    return {where, "residual", "hyper-connections (mHC)", str("hc_mult=", N), "new",
            str("not dayzero's mHC (hc_mult ", N, "): ", list(other.empty() ? mine : other))};
  return {where, "residual", "hyper-connections (mHC)", str("mHC streams=", N), "reusable with different parameters",
          str("6 tensors, all of a dayzero mHC: ", list(mine, 2))};
}

std::string list(const std::vector<std::string>& v, size_t most) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < most; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > most) s += str(" (and ", v.size() - most, " more)");
  return s;
}

// Classifies one module group against `fps`; unmatched tensors make it new.
Module classify(const std::string& where, const std::string& module, const Names& n, const json& c,
                const std::vector<Fingerprint>& fps, const std::string& prefix) {
  Module m{where, module, "?", "", "new", ""};
  size_t best = 0;
  for (const auto& f : fps) {
    const std::set<std::string> got = match(f, n);
    if (got.empty() || got.size() <= best) continue;
    best = got.size();
    m.kind = f.kind;
    m.params = f.params(n, c);
    std::vector<std::string> rest;
    for (const auto& kv : n)
      if (!got.count(kv.first)) rest.push_back(prefix + kv.first + " " + shape_str(kv.second));
    if (!rest.empty()) {
      m.status = "new";
      m.evidence = str("a ", f.kind, " plus tensors no dayzero module has: ", list(rest));
    } else if (auto it = adapted().find(m.params); it != adapted().end()) {
      m.status = "reusable";
      m.evidence = str("tensors and shapes as ", it->second, "'s");
    } else {
      m.status = "reusable with different parameters";
      m.evidence = str(got.size(), " tensors, all of a dayzero ", f.kind);
    }
  }
  if (best == 0) {
    std::vector<std::string> all;
    for (const auto& kv : n) all.push_back(prefix + kv.first + " " + shape_str(kv.second));
    m.evidence = str("no dayzero module has these tensors: ", list(all));
  }
  return m;
}

}  // namespace

std::vector<StructRow> structural_diff(const std::string& dir, const nlohmann::json& config, std::string* family) {
  std::vector<Module> rows;
  json c = config;
  std::string wrapper;
  if (c.contains("text_config") && c["text_config"].is_object()) {
    wrapper = c.value("model_type", "");
    json t = c["text_config"];
    for (auto it = c.begin(); it != c.end(); ++it)
      if (it.key() != "text_config" && !t.contains(it.key())) t[it.key()] = it.value();
    c = t;
  }
  *family = c.value("model_type", std::string("?")) + (wrapper.empty() ? "" : " (in " + wrapper + ")");
  const std::string mt = c.value("model_type", std::string("?"));
  if (is_supported_model_type(mt))
    rows.push_back({"config", "normaliser", "config.json", "", "reusable",
                    str("dayzero parses model_type '", mt, "' (its parser is not used by this diff)")});
  else
    rows.push_back({"config", "normaliser", "config.json", "", "new",
                    str("model_type '", mt, "' has no config parser in dayzero: the normalisation to its layer list is new")});
  // Config keys no dayzero parser reads.
  {
    std::vector<std::string> unknown;
    for (auto it = c.begin(); it != c.end(); ++it)
      if (!known_keys().count(it.key())) {
        std::string v = it.value().dump();
        if (v.size() > 40) v = v.substr(0, 37) + "...";
        unknown.push_back(it.key() + "=" + v);
      }
    if (!unknown.empty())
      rows.push_back({"config", "keys", "config.json", "", "new",
                      str("keys no dayzero module reads: ", list(unknown, 12))});
  }

  std::unique_ptr<Checkpoint> ck = Checkpoint::open(dir);
  // The text model's tensors under model.; a wrapper's vision tower and MTP layers set apart.
  std::map<int64_t, std::map<std::string, Names>> layers;  // layer -> group -> names
  std::map<int64_t, std::set<std::string>> mx4;             // layer -> groups holding MXFP4 weights
  Names top, vision, mtp;
  const int64_t L = ji(c, "num_hidden_layers", -1);
  for (const auto& name : ck->names()) {
    const Shape& s = ck->info(name).shape;
    std::string n = name;
    for (const char* p : {"model.language_model.", "language_model.model."})
      if (n.rfind(p, 0) == 0) n = "model." + n.substr(std::string(p).size());
    if (n.rfind("language_model.lm_head.", 0) == 0) n = n.substr(15);
    if (n.rfind("model.visual.", 0) == 0 || n.rfind("vision_tower.", 0) == 0 || n.rfind("model.vision_tower.", 0) == 0 ||
        n.rfind("mm_projector.", 0) == 0 || n.rfind("multi_modal_projector.", 0) == 0 ||
        n.rfind("model.multi_modal_projector.", 0) == 0 || n.rfind("visual.", 0) == 0) {
      vision[name] = s;
      continue;
    }
    if (n.rfind("mtp.", 0) == 0) {
      mtp[name] = s;
      continue;
    }
    const std::string lp = "model.layers.";
    if (n.rfind(lp, 0) != 0) {
      top[n] = s;
      continue;
    }
    const size_t dot = n.find('.', lp.size());
    const int64_t li = std::stoll(n.substr(lp.size(), dot - lp.size()));
    if (L >= 0 && li >= L) {  // DeepSeek-style MTP layers after the stack
      mtp[name] = s;
      continue;
    }
    const std::string rest = n.substr(dot + 1);
    const size_t d2 = rest.find('.');
    std::string group = rest.substr(0, d2);
    // the layer's own tensors (norms, residual mixing) form one group
    if (d2 == std::string::npos || group == "input_layernorm" || group == "post_attention_layernorm" ||
        group == "attn_norm" || group == "ffn_norm")
      group = "";
    // Block AttnRes (Kimi K3): the two sites' pseudo-query projections and key norms
    if (group == "self_attention_res_norm" || group == "self_attention_res_proj" || group == "mlp_res_norm" ||
        group == "mlp_res_proj")
      group = "attn_res";
    layers[li][group][group.empty() || group == "attn_res" ? rest : rest.substr(d2 + 1)] = s;
    if (ck->info(name).mx_scale) mx4[li].insert(group);
  }
  // model-level tensors
  {
    std::vector<std::string> known, other, attn_res;
    std::vector<std::string> hc;
    for (const auto& kv : top) {
      const std::string& k = kv.first;
      const std::string e = k + " " + shape_str(kv.second);
      if (k == "model.embed_tokens.weight" || k == "model.norm.weight" || k == "lm_head.weight" || k == "head.weight")
        known.push_back(e);  // head.weight: DeepSeek's own name for the LM head
      else if (k.rfind("model.output_attn_res_", 0) == 0)
        attn_res.push_back(e);
      else if (k.rfind("model.hc_head.", 0) == 0)
        hc.push_back(e);
      else
        other.push_back(e);
    }
    rows.push_back({"model", "embedding, final norm, LM head", "embedding + rmsnorm + linear", list(known),
                    known.empty() ? "new" : "reusable", ""});
    if (!hc.empty()) {  // DeepSeek-V4's weighted head: hc_fn [N, N·D], hc_base [N], hc_scale [1]
      const int64_t N = ji(c, "hc_mult", 0), D = ji(c, "hidden_size", 0);
      const bool ok = hc.size() == 3 && top.count("model.hc_head.hc_fn") && top.at("model.hc_head.hc_fn") == Shape{N, N * D} &&
                      top.count("model.hc_head.hc_base") && top.at("model.hc_head.hc_base") == Shape{N} &&
                      top.count("model.hc_head.hc_scale") && top.at("model.hc_head.hc_scale") == Shape{1};
      rows.push_back({"model", "hyper-connection head", "mHC (weighted)", str("streams=", N),
                      ok ? "reusable with different parameters" : "new",
                      ok ? str("3 tensors, all of dayzero's weighted mHC head: ", list(hc))
                         : str("not dayzero's weighted mHC head (hc_mult ", N, "): ", list(hc))});
    }
    if (!attn_res.empty()) {  // Block AttnRes's output site: key norm [D], pseudo-query [1, D]
      const int64_t D = ji(c, "hidden_size", 0);
      const bool ok = attn_res.size() == 2 && top.count("model.output_attn_res_norm.weight") &&
                      top.at("model.output_attn_res_norm.weight") == Shape{D} &&
                      top.count("model.output_attn_res_proj.weight") && top.at("model.output_attn_res_proj.weight") == Shape{1, D};
      rows.push_back({"model", "residual (output site)", "Block AttnRes", str("block=", ji(c, "attn_res_block_size")),
                      ok ? "reusable with different parameters" : "new",
                      ok ? str("2 tensors, all of dayzero's Block AttnRes: ", list(attn_res))
                         : str("not dayzero's Block AttnRes: ", list(attn_res))});
    }
    if (!other.empty())
      rows.push_back({"model", "other", "?", "", "new", str("no dayzero module has these tensors: ", list(other))});
  }
  for (const auto& lv : layers) {
    const std::string where = str("layer ", lv.first);
    const size_t first = rows.size();
    for (const auto& gv : lv.second) {
      const std::string& g = gv.first;
      // (the AttnRes group is the layer's own *_res_{norm,proj} tensors: no group in their names)
      const std::string pre = str("model.layers.", lv.first, ".", g.empty() || g == "attn_res" ? "" : g + ".");
      if (g == "self_attn" || g == "linear_attn" || g == "attn" || g == "mixer") {
        rows.push_back(classify(where, "token mixer", gv.second, c, mixers(), pre));
      } else if (g == "mlp" || g == "block_sparse_moe" || g == "feed_forward" || g == "moe" || g == "ffn") {
        Module m = classify(where, "ffn", gv.second, c, ffns(), pre);
        if (mx4[lv.first].count(g)) {  // MXFP4 weights (compressed-tensors): dayzero decodes them
          m.params += " mxfp4";
          if (m.status == "reusable with different parameters")
            if (auto it = adapted().find(m.params); it != adapted().end())
              m.status = "reusable", m.evidence = str("tensors and shapes as ", it->second, "'s");
        }
        rows.push_back(m);
      } else if (g == "attn_res") {  // [D] key norm and [1, D] pseudo-query per site
        const int64_t D = ji(c, "hidden_size", 0);
        bool ok = gv.second.size() == 4;
        for (const char* site : {"self_attention_res", "mlp_res"})
          ok = ok && has(gv.second, str(site, "_norm.weight")) && gv.second.at(str(site, "_norm.weight")) == Shape{D} &&
               has(gv.second, str(site, "_proj.weight")) && gv.second.at(str(site, "_proj.weight")) == Shape{1, D};
        std::vector<std::string> all;
        for (const auto& kv : gv.second) all.push_back(pre + kv.first + " " + shape_str(kv.second));
        rows.push_back({where, "residual", "Block AttnRes", str("block=", ji(c, "attn_res_block_size")),
                        ok ? "reusable with different parameters" : "new",
                        ok ? str("4 tensors, all of dayzero's Block AttnRes: ", list(all, 2))
                           : str("not dayzero's Block AttnRes: ", list(all))});
      } else if (g.empty()) {
        // pre-norms are dayzero's; anything else at layer level is residual mixing
        std::vector<std::string> other, hc;
        for (const auto& kv : gv.second) {
          if (kv.first == "input_layernorm.weight" || kv.first == "post_attention_layernorm.weight" ||
              kv.first == "attn_norm.weight" || kv.first == "ffn_norm.weight")
            continue;  // pre-norms (DeepSeek names them attn_norm / ffn_norm)
          (kv.first.find("hc") != std::string::npos ? hc : other).push_back(pre + kv.first + " " + shape_str(kv.second));
        }
        if (!hc.empty()) rows.push_back(hc_row(where, pre, gv.second, c));
        if (!other.empty())
          rows.push_back({where, "layer", "?", "", "new", str("no dayzero module has these tensors: ", list(other))});
      } else if (g.rfind("hc", 0) == 0 || g.find("_hc") != std::string::npos) {
        Names n;  // transformers' own names attn_hc.fn / ffn_hc.base ...: read as hc_attn_fn / hc_ffn_base
        for (const auto& kv : gv.second) n[g == "attn_hc" || g == "ffn_hc" ? "hc_" + g.substr(0, g.size() - 3) + "_" + kv.first : kv.first] = kv.second;
        rows.push_back(hc_row(where, pre, n, c));
      } else if (g.find("attn_res") != std::string::npos) {
        rows.push_back({where, "residual", "Block AttnRes", "", "reusable", str(gv.second.size(), " tensors under ", pre)});
      } else {
        std::vector<std::string> all;
        for (const auto& kv : gv.second) all.push_back(pre + kv.first + " " + shape_str(kv.second));
        rows.push_back({where, g, "?", "", "new", str("no dayzero module has these tensors: ", list(all))});
      }
    }
    auto rank = [](const Module& m) {
      return m.module == "residual" ? 0 : m.module == "token mixer" ? 1 : m.module == "ffn" ? 2 : 3;
    };
    std::stable_sort(rows.begin() + long(first), rows.end(),
                     [&](const Module& a, const Module& b) { return rank(a) < rank(b); });
  }
  if (!vision.empty()) {
    std::vector<std::string> v;
    for (const auto& kv : vision) v.push_back(kv.first);
    rows.push_back({"model", "vision tower", "recognised, not loaded", str(vision.size(), " tensors"), "reusable",
                    list(v, 2)});
  }
  if (!mtp.empty()) {
    std::vector<std::string> v;
    for (const auto& kv : mtp) v.push_back(kv.first);
    rows.push_back({"model", "MTP layers", "speculative", str(mtp.size(), " tensors"), "reusable",
                    "multi-token prediction (accepted; --speculative mtp runs the published DeepSeek / Qwen layouts): " + list(v, 2)});
  }
  std::vector<StructRow> out;
  for (auto& r : rows) out.push_back({r.where, r.module, r.kind, r.params, r.status, r.evidence});
  return out;
}

}  // namespace dz
