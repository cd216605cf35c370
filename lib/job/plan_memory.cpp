#include "job/plan_memory.hpp"

#include <algorithm>
#include <filesystem>

#include "core/error.hpp"
#include "io/checkpoint.hpp"
#include "model/model.hpp"

namespace dz {

namespace {

// Tensors every TP rank holds whole (the modules' loaders: embedding, norms, router, MLA's down
// projections, the DSA indexer, KDA's low-rank gate inputs, AttnRes); everything else is split.
bool replicated(const std::string& n) {
  for (const char* k : {"embed_tokens", "norm", ".gate.weight", "e_score_correction_bias", "kv_a_proj_with_mqa",
                        "q_a_proj", ".indexer.", "f_a_proj", "g_a_proj", "attn_res", "shared_expert_gate",
                        "routed_expert_down_proj"})
    if (n.find(k) != std::string::npos) return true;
  return false;
}

// The module uploads fp32 `param`s (1-D tensors, the router) and `weight`s in the weight dtype.
bool fp32_param(const std::string& n, const Shape& s) {
  return s.size() == 1 || n.find(".gate.weight") != std::string::npos ||
         n.find("shared_expert_gate") != std::string::npos;
}

// On the GPU an FP8 block-scaled weight stays FP8 (CudaBackend::weight) when it is a 2-D linear
// weight with in-features a multiple of 128 and not one of the stacked routed experts; under TP
// the rank's slice must keep whole 128 x 128 blocks (conservatively here: both dimensions divide
// by 128 x tp). Bytes: the codes plus the block scales [ceil(N / 128), ceil(K / 128) padded to 4]
// fp32. cuBLASLt refuses a few small shapes at load (those go BF16 and are counted here at 1 byte:
// tiny weights, e.g. 64 x 128).
bool kept_fp8(const std::string& n, const Shape& s, const MemoryQuery& q, bool repl) {
  if (!q.cuda || !q.fp8_block.count(n) || s.size() != 2 || s[1] % 128 != 0) return false;
  if (n.find(".experts.") != std::string::npos && n.find("shared") == std::string::npos) return false;
  return repl || q.tp == 1 || (s[0] % (128 * q.tp) == 0 && s[1] % (128 * q.tp) == 0);
}
double fp8_bytes(const Shape& s) {
  const double nb = double((s[0] + 127) / 128), kb = double((s[1] / 128 + 3) / 4 * 4);
  return double(numel(s)) + nb * kb * 4;
}

// Kimi K3's routed experts on the GPU stay MXFP4 (CudaBackend::mxfp4_weight, dummy_mx4_experts)
// when the config declares MXFP4 and every expert input is whole 32-groups (under TP the width
// slice too): half a byte per weight plus one E8M0 byte per 32.
bool kept_mx4(const std::string& n, const Shape& s, const ModelConfig& cfg, const MemoryQuery& q) {
  if (!q.cuda || !cfg.weights_mxfp4 || s.size() != 2 || n.find(".experts.") == std::string::npos ||
      n.find("shared") != std::string::npos)
    return false;
  const int64_t I = cfg.moe_intermediate_size, DX = cfg.moe_latent_size > 0 ? cfg.moe_latent_size : cfg.hidden_size;
  return DX % 32 == 0 && I % (32 * (q.ep > 1 ? 1 : q.tp)) == 0;  // (expert parallelism: whole experts)
}

// RowStore capacity after n appends: 64, doubling.
int64_t row_capacity(int64_t n) {
  int64_t c = 64;
  while (c < n) c *= 2;
  return c;
}

}  // namespace

std::set<std::string> fp8_block_weights(const std::string& dir) {
  std::set<std::string> out;
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(dir) / "model.safetensors") && !fs::exists(fs::path(dir) / "model.safetensors.index.json"))
    return out;
  auto ck = Checkpoint::open(dir);  // headers only: the tensors stay mapped, unread
  for (const auto& n : ck->names())
    if (ck->info(n).dtype == DType::F8_E4M3 && ck->has(n + "_scale_inv")) out.insert(n);
  return out;
}

MemoryPlan plan_memory(const ModelConfig& cfg, const MemoryQuery& q) {
  DZ_CHECK(q.tp >= 1 && q.doc_tokens >= 1 && q.forward_tokens >= 1 && q.ep >= 1, "plan: bad memory query");
  MemoryPlan p;
  const double act = q.cuda ? 2 : 4, wt = q.cuda ? 2 : 4, t = double(q.tp);
  // ---- weights: every tensor the model asks for (names and shapes only, nothing generated) ----
  auto ck = Checkpoint::dummy(0);
  ck->set_dry_run(true);
  Model::build(cfg, *ck);
  for (const auto& n : ck->names()) {
    const Shape& s = ck->info(n).shape;
    const bool repl = replicated(n);
    const bool routed = n.find(".experts.") != std::string::npos && n.find("shared") == std::string::npos;
    const bool f8 = kept_fp8(n, s, q, repl), mx = kept_mx4(n, s, cfg, q);
    p.fp8_weights += f8;
    double b = f8 ? fp8_bytes(s) : mx ? double(numel(s)) * (0.5 + 1.0 / 32) : double(numel(s)) * (fp32_param(n, s) ? 4 : wt);
    if (routed && q.ep > 1)  // expert parallelism: n_experts / ep whole experts a rank
      b /= double(q.ep);
    else if (!repl)
      b = n.find("lm_head") != std::string::npos ? double((s[0] + q.tp - 1) / q.tp) * double(s[1]) * wt : b / t;
    p.weights += b;
    p.detail[n.find(".experts.") != std::string::npos && n.find("shared") == std::string::npos ? "weights_experts"
                                                                                               : "weights_other"] += b;
  }
  if (cfg.tie_word_embeddings) p.weights += double((cfg.vocab_size + q.tp - 1) / q.tp) * double(cfg.hidden_size) * wt;

  // ---- state of one document, every layer ----
  const double L = double(q.doc_tokens), cap = double(row_capacity(q.doc_tokens)), T = double(q.forward_tokens);
  const double D = double(cfg.hidden_size);
  const double HV = double(cfg.la_num_v_heads) / t, HK = double(cfg.la_num_k_heads) / t;
  const double K = double(cfg.la_head_k_dim), V = double(cfg.la_head_v_dim), W = double(cfg.la_conv_kernel);
  const double H = double(cfg.num_heads) / t;
  const double dqk = double(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim), dv = double(cfg.v_head_dim);
  double mixer_act = 0, la_state = 0;  // la_state: one document's linear-attention states (pooled)
  for (const auto& ls : cfg.layers) {
    switch (ls.mixer) {
      case MixerKind::KDA:
      case MixerKind::GDN: {
        const double C = 2 * HK * K + HV * V;  // conv channels (q, k, v)
        la_state += HV * K * V * 4 + (W - 1) * C * act;
        // projections before and after the conv, gates, output; the chunked scan's per-chunk states
        const double a = T * (2 * C + 3 * HV * V + 2 * HV * K) * act + (T / 64 + 1) * HV * K * V * 4;
        mixer_act = std::max(mixer_act, a);
        break;
      }
      case MixerKind::MLA: {
        const double kv = double(cfg.kv_lora_rank + cfg.qk_rope_head_dim) * (q.kv_fp8 ? 1.1 : act);
        const bool own = ls.has_indexer && !ls.shared_indexer;  // a shared layer keeps no indexer keys
        const double ik = own ? double(cfg.index_head_dim) * act : 0;
        p.state += cap * (kv + ik);
        // explicit form (the larger one: forward() takes the absorbed form only when it is
        // cheaper, i.e. for few queries): the cached latent copied out, expanded through kv_b
        // and split into keys / values of every cached position -- in a packed prefill of every
        // packed document's rows at once (forward_packed); queries, output
        const double S = std::max(L, std::min(T, double(q.docs) * L)), R = double(cfg.kv_lora_rank),
                     nv = double(cfg.qk_nope_head_dim) + dv;
        double a = S * (R + H * nv + H * (dqk + dv)) * act + T * H * (2 * dqk + 2 * dv) * act;
        if (own) a += T * double(cfg.index_n_heads) * double(cfg.index_head_dim) * act + std::min(T, 4096.0) * S * 4;
        if (own && cfg.index_kpool > 0) {  // the group products (<= 512 MiB) and q repeated for them (<= 256 MiB)
          const double prod = T * double(cfg.index_n_heads) * std::max(1.0, S / double(cfg.index_kpool)) * 4;
          a += std::min(prod, 512.0 * (1 << 20)) +
               std::min(T * double(cfg.index_n_heads) * 3 * double(cfg.index_head_dim) * 2, 256.0 * (1 << 20));
        }
        if (ls.has_indexer) a += T * double(cfg.index_topk) * 4;
        mixer_act = std::max(mixer_act, a);
        break;
      }
      case MixerKind::GQA: {
        const double Hkv = double(cfg.num_kv_heads) / t, Dh = double(cfg.head_dim);
        p.state += cap * 2 * Hkv * Dh * act;
        mixer_act = std::max(mixer_act, T * (3 * H * Dh + 2 * Hkv * Dh) * act * 2);
        break;
      }
      case MixerKind::DSV4: {  // replicated over TP: whole heads on every rank
        const double Dh = double(cfg.head_dim), Hf = double(cfg.num_heads), m = double(ls.compress_rate);
        const double Di = ls.has_indexer ? double(cfg.index_head_dim) : 0;
        // every token's kv row, the compressed entries (and the indexer's), the pending window rows
        p.state += cap * Dh * act + (m > 0 ? cap / m * (Dh + Di) * act + 2 * m * 4 * (Dh + Di) * act : 0);
        // q, o (and its rotation), the compressor / indexer projections and queries, the selection
        double a = T * (3 * Hf * Dh + double(cfg.q_lora_rank) + 2 * Dh) * act;
        if (m > 0) a += T * 4 * (Dh + Di) * act * 2;
        if (ls.has_indexer) a += T * (double(cfg.index_n_heads) * Di * act + double(cfg.index_topk) * 4);
        mixer_act = std::max(mixer_act, a);
        break;
      }
    }
  }
  // ---- one forward's activations: residual stream + the largest sub-layer + the LM head ----
  double ffn_act = 0;
  for (const auto& ls : cfg.layers) {
    if (ls.ffn == FfnKind::MoE) {
      // expert parallelism: whole-width experts, on this rank's pairs and at most as many from each of
      // the other ep / tp CP members (the all-to-all's rows)
      const double M = q.ep > 1 ? double(q.ep) / t : 1.0;
      const double n = T * double(cfg.num_experts_per_tok) * M,
                   I = double(cfg.moe_intermediate_size) / (q.ep > 1 ? 1.0 : t);
      const double S = double(cfg.shared_intermediate_size > 0 ? cfg.shared_intermediate_size
                                                               : cfg.n_shared_experts * cfg.moe_intermediate_size) / t;
      const double DX = cfg.moe_latent_size > 0 ? double(cfg.moe_latent_size) : D;  // the experts' input
      ffn_act = std::max(ffn_act, T * D * 4 + T * double(cfg.n_routed_experts) * 4 + n * 40 +
                                      n * (2 * DX + 2 * I) * act + T * (3 * S + D + 2 * DX) * act);
    } else {
      ffn_act = std::max(ffn_act, T * 3 * double(cfg.intermediate_size) / t * act);
    }
  }
  const double Vs = double((cfg.vocab_size + q.tp - 1) / q.tp);
  const double lm_rows = std::max(1.0, std::min({T, 8192.0, double(int64_t(1) << 28) / Vs}));
  const double lm = lm_rows * Vs * 4 + T * D * act;
  const double stream = T * D * 4 + 2 * T * D * act +
                        (cfg.attn_res_block_size > 0 ? (double(cfg.num_layers) / double(cfg.attn_res_block_size) + 2) *
                                                           T * D * 4
                                                     : 0) +
                        // mHC: the N streams, the collapsed input, the coefficients and their projection
                        (cfg.hc_mult > 0 ? T * double(cfg.hc_mult) * D * 4 + T * D * 4 +
                                               2 * T * double((2 + cfg.hc_mult) * cfg.hc_mult) * 4
                                         : 0);
  p.detail["activations_mixer"] = mixer_act;
  p.detail["activations_ffn"] = ffn_act;
  p.detail["activations_lm_head"] = lm;
  p.detail["activations_stream"] = stream;
  // x1.3: the stream-ordered pool's high-water mark sits above the sum of the live temporaries
  // (measured on the H200, Kimi-Linear-48B cut to 8 layers, T = 8192: 1.45 GiB vs 1.18 estimated).
  p.activations = 1.3 * (stream + std::max({mixer_act, ffn_act, lm}));
  // Linear-attention states live in per-layer pools that double (model/la_state.hpp LaPool):
  // room for the next power of two of documents; caches are per document.
  int64_t slots = 1;
  while (slots < q.docs) slots *= 2;
  p.state = p.state * double(std::max<int64_t>(q.docs, 1)) + la_state * double(slots);
  p.workspace = q.cuda ? double(size_t(32) << 20) : 0;  // cuBLAS workspace
  return p;
}

}  // namespace dz
