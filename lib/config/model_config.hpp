// One internal description for every supported checkpoint family. Parsers in config/ fill it from
// each Hugging Face config.json format; the model is built from it alone (plus tensor names).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dz {

enum class Family { KimiLinear, DeepseekV32, Qwen3Next, Dayzero, Glm5Next, DeepseekV4 };
// MLA with has_indexer = DSA sparse attention; DSV4 = DeepSeek-V4's shared-KV attention over a
// sliding window and compressed entries (CSA with its indexer, HCA, or the window alone).
enum class MixerKind { KDA, GDN, MLA, GQA, DSV4 };
constexpr int kMixerKinds = 5;
enum class FfnKind { Dense, MoE };
enum class KdaGate { Softplus, LowerBoundSigmoid };  // per-channel decay forms of KDA
enum class RopeStyle { NeoX, Interleaved };          // rotate halves vs. adjacent pairs
enum class ScoreFunc { Softmax, Sigmoid, SqrtSoftplus };  // SqrtSoftplus: sqrt(softplus(x)) (DeepSeek-V4)

const char* to_string(Family f);
const char* to_string(MixerKind m);
const char* to_string(FfnKind f);

struct LayerSpec {
  MixerKind mixer = MixerKind::MLA;
  FfnKind ffn = FfnKind::Dense;
  bool has_indexer = false;  // DSA lightning indexer + Top-K in front of MLA
  // GLM-5 indexer_types "shared": this layer has no indexer of its own and attends to the Top-K
  // sets of the last earlier layer that runs one (has_indexer stays true: the attention is sparse).
  bool shared_indexer = false;
  // DeepSeek-V4 (MixerKind::DSV4): compressed entries of compress_rate tokens (0: the sliding
  // window alone); has_indexer: CSA's indexer picks index_topk of them (else HCA: all visible).
  int64_t compress_rate = 0;
  bool hash_moe = false;  // experts from the fixed table gate.tid2eid[token id] (DeepSeek-V4 hash_moe)
};

struct RopeConfig {
  float theta = 10000.f;
  RopeStyle style = RopeStyle::NeoX;
  float partial_rotary_factor = 1.f;  // fraction of head_dim that is rotated (qwen3_next: 0.25)
  // YaRN as DeepSeek uses it (rope_scaling.type == "yarn")
  bool yarn = false;
  float yarn_factor = 1.f;
  int64_t yarn_original_max_pos = 4096;
  float yarn_beta_fast = 32.f;
  float yarn_beta_slow = 1.f;
  float yarn_mscale = 1.f;
  float yarn_mscale_all_dim = 0.f;
  float yarn_attention_factor = -1.f;  // >= 0: the cos/sin multiplier as given (DeepSeek-V4: 1)
};

struct ModelConfig {
  Family family = Family::Dayzero;
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  float rms_norm_eps = 1e-6f;
  bool norm_zero_centered = false;  // RMSNorm weight applied as (1 + w) (qwen3_next)
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;

  std::vector<LayerSpec> layers;  // size num_layers

  // --- linear attention (KDA / Gated DeltaNet) ---
  int64_t la_num_k_heads = 0;  // key/query heads
  int64_t la_num_v_heads = 0;  // value heads (GDN: multiple of k heads; KDA: equal)
  int64_t la_head_k_dim = 0;
  int64_t la_head_v_dim = 0;
  int64_t la_conv_kernel = 4;
  KdaGate kda_gate = KdaGate::Softplus;
  float kda_gate_lower_bound = -5.f;  // LowerBoundSigmoid: g = lower_bound * sigmoid(...)
  bool kda_full_rank_gate = false;    // KDA output gate g_proj [H·V, D] (Kimi K3) instead of g_a_proj · g_b_proj

  // --- MLA (kimi_linear, deepseek_v32, dayzero) ---
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;  // 0: q_proj directly from hidden
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool mla_output_gate = false;  // sigmoid output gate (Kimi K3)
  float mla_latent_norm_eps = 1e-6f;  // q_a_layernorm / kv_a_layernorm eps (GLM-5.3-Flash: rms_norm_eps)
  RopeConfig rope;

  // --- DSA lightning indexer (deepseek_v32, dayzero) ---
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  RopeStyle index_rope_style = RopeStyle::NeoX;  // deepseek_v32 rotates halves, GLM-5 adjacent pairs
  // GLM-5.3-Flash k-pool indexer: keys pooled in groups of index_kpool (a learned softmax over each
  // group), Top-K over index_topk / index_kpool complete visible groups, expanded to their tokens,
  // plus the query's incomplete group when index_kpool_tail. 0: per-token keys (DeepSeek-V3.2).
  int64_t index_kpool = 0;
  bool index_kpool_tail = true;

  // --- gated GQA full attention (qwen3_next) ---
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  bool attn_output_gate = false;
  // Qwen3.5: in_proj_qkv / in_proj_z / in_proj_b / in_proj_a instead of Qwen3-Next's fused,
  // per-key-head interleaved in_proj_qkvz / in_proj_ba (same module otherwise).
  bool gdn_split_proj = false;

  // --- FFN ---
  std::string hidden_act = "silu";
  int64_t intermediate_size = 0;  // dense MLP width
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_shared_experts = 0;           // shared experts fused into one MLP of n × width
  int64_t shared_intermediate_size = 0;   // width of the shared-expert MLP (total)
  bool shared_expert_gate = false;        // sigmoid gate on the shared expert (qwen3_next)
  ScoreFunc score_func = ScoreFunc::Softmax;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.f;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool router_correction_bias = false;  // e_score_correction_bias (selection only)

  float swiglu_limit = 0.f;  // SwiGLU clamp of every MLP / expert (GLM-5.3-Flash); 0: none
  // SiTU (Kimi K3 hidden_act "situ"), in every MLP and expert instead of SiLU:
  //   beta·tanh(g/beta)·sigmoid(g) · lb·tanh(u/lb)   (activation_situ_beta, activation_situ_linear_beta)
  float situ_beta = 0.f;         // > 0: SiTU; 0: SiLU
  float situ_linear_beta = 0.f;  // > 0: the up branch bounded as above; 0: unbounded (linear_beta null)
  // Latent MoE (Kimi K3 routed_expert_hidden_size): the routed experts run on down(x) [T, L] and
  // their sum returns through up(RMSNorm(.)); the router and the shared experts read x. 0: none.
  int64_t moe_latent_size = 0;
  bool moe_latent_norm = true;  // latent_moe_use_norm
  // Quantised checkpoint weights (quantization_config): compressed-tensors "mxfp4-pack-quantized"
  // (Kimi K3's routed experts; any MXFP4 pair in the files needs this declared).
  bool weights_mxfp4 = false;

  // --- manifold-constrained hyper-connections (GLM-5.3-Flash mHC) ---
  int64_t hc_mult = 0;  // residual streams; 0: the plain residual
  float hc_eps = 1e-6f;
  int64_t hc_sinkhorn_iters = 20;

  // --- DeepSeek-V4 attention (MixerKind::DSV4; head_dim, num_heads, q_lora_rank above) ---
  int64_t sliding_window = 0;          // raw rows (t - W, t] per query
  int64_t o_groups = 0, o_lora_rank = 0;  // grouped low-rank output projection
  RopeConfig rope_compress;            // CSA / HCA layers, their compressors and indexer ("compress")
  bool hc_head_weighted = false;       // mHC head: learned weights (hc_head.*) instead of the mean
  // The MTP block's attention (entry num_hidden_layers of layer_types / compress_ratios, 0 in every
  // published config: the sliding window alone; sliding when the entry is absent, as vLLM reads it).
  int64_t mtp_compress_rate = 0;
  bool mtp_csa = false;

  // --- Block AttnRes ---
  int64_t attn_res_block_size = 0;  // 0: standard additive residual

  // --- run-time precision options (DESIGN §5; set by `run`, not read from config.json) ---
  // The CPU backend emulates them bit-exactly (core/fp8.hpp), as the CUDA kernels quantize.
  bool kv_cache_fp8 = false;  // MLA latent cache: FP8 E4M3 per token per 128-tile (+ fp32 scale), RoPE part BF16
  bool index_mxfp8 = false;   // DSA indexer queries and keys: MXFP8 (E4M3, one E8M0 scale per 32)
  bool load_mtp = false;      // build the first MTP layer (--speculative mtp; make-model writes its weights)

  // --- checkpoint packaging ---
  std::string wrapper_model_type;  // multimodal wrapper scored on its text model (qwen3_5_moe), else ""
  bool has_vision = false;         // the wrapper declares a vision tower: its tensors are recognised, not loaded
  int64_t mtp_layers = 0;          // multi-token-prediction layers in the checkpoint (accepted, not run)

  nlohmann::json raw;  // the config.json as read (a wrapper's text_config, merged; see parse)

  // Parse a Hugging Face config.json (any supported family). Throws naming the field on error.
  // Width of a DSA selection row: index_topk, plus index_kpool − 1 for the k-pool tail.
  int64_t dsa_sel_width() const { return index_topk + (index_kpool > 0 && index_kpool_tail ? index_kpool - 1 : 0); }

  static ModelConfig from_json(const nlohmann::json& j);
  static ModelConfig from_file(const std::string& path);
  // Consistency checks shared by all families (dims positive, layer list complete, ...).
  void validate() const;
  nlohmann::json to_json() const;  // the normalised description (for reports / inspect)
};

// Whether some parser of ModelConfig::from_json takes this model_type (wrappers included).
bool is_supported_model_type(const std::string& model_type);

}  // namespace dz
