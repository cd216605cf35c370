// Multi-head latent attention (MLA) token mixer, dense or with the DSA indexer (sparse Top-K).
//
// Per token (x = the layer's normed input):
//   q       = q_proj(x)  or  q_b_proj(q_a_layernorm(q_a_proj(x)))        [H, nope + rope]
//   [c, kr] = kv_a_proj_with_mqa(x);  c = kv_a_layernorm(c)               c [R], kr [rope]
//   RoPE on q[:, nope:] and kr (DeepSeek: interleaved pairs; Kimi: none, see below)
//   k[h] = [W_uk[h] c, kr],  v[h] = W_uv[h] c                             (kv_b_proj rows per head:
//                                                                          nope of W_uk, then vd of W_uv)
//   o    = softmax(scale q·k) v over the causal (or Top-K) keys          [H, vd]
//   o   *= sigmoid(g_proj(x))   (Kimi K3 mla_use_output_gate)
//   out  = o_proj(o)
// The cache keeps c and kr per token (what an MLA cache holds). This reference materialises k and
// v for every cached token on each call; mla_attention_absorbed (ops/attention.hpp) computes the
// same result on the latent directly and is tested equal.
//
// RoPE conventions found in the references:
// - deepseek_v32: DeepSeek's code rotates interleaved pairs; transformers de-interleaves the rope
//   slice then rotates halves, which applies the same rotation to q and k in a permuted layout,
//   so every q·k (all attention sees) is identical to RopeStyle::Interleaved, which we use.
// - kimi_linear: transformers' KimiLinearAttention applies no RoPE at all (`mla_use_nope`); the
//   kr slice is used as is. Dayzero presets follow Kimi unless config.json says mla_use_nope=false.
// Softmax scale: (nope + rope)^-0.5 × Rope::softmax_scale_mult() (YaRN mscale², DeepSeek).
// q_a_layernorm / kv_a_layernorm use eps 1e-6 (both modeling files build them with the default
// eps, not rms_norm_eps).
#include <cmath>
#include <memory>

#include "core/error.hpp"
#include "core/linalg.hpp"
#include "model/module.hpp"
#include "ops/attention.hpp"
#include "ops/indexer.hpp"
#include "ops/norm.hpp"
#include "ops/rope.hpp"

namespace dz {

namespace {

constexpr float kLatentNormEps = 1e-6f;

const float* opt(const Tensor& t) { return t.empty() ? nullptr : t.ptr(); }

class MlaMixer : public Mixer {
 public:
  MlaMixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix) {
    D_ = cfg.hidden_size;
    H_ = cfg.num_heads;
    q_lora_ = cfg.q_lora_rank;
    R_ = cfg.kv_lora_rank;
    nope_ = cfg.qk_nope_head_dim;
    rope_dim_ = cfg.qk_rope_head_dim;
    vd_ = cfg.v_head_dim;
    const std::string p = prefix + "self_attn.";
    DZ_CHECK(D_ > 0 && H_ > 0 && R_ > 0 && nope_ >= 0 && rope_dim_ >= 0 && vd_ > 0 && nope_ + rope_dim_ > 0,
             p, ": bad MLA dims (heads ", H_, ", kv_lora_rank ", R_, ", nope ", nope_, ", rope ", rope_dim_,
             ", v ", vd_, ")");
    DZ_CHECK(rope_dim_ % 2 == 0, p, ": qk_rope_head_dim must be even, got ", rope_dim_);
    const int64_t Dq = nope_ + rope_dim_;
    if (q_lora_ > 0) {
      q_a_ = ck.get(p + "q_a_proj.weight", {q_lora_, D_}, Init::normal(0.02f));
      q_a_bias_ = ck.get_optional(p + "q_a_proj.bias", {q_lora_}, Init::zeros());
      q_a_norm_ = ck.get(p + "q_a_layernorm.weight", {q_lora_}, Init::ones());
      q_b_ = ck.get(p + "q_b_proj.weight", {H_ * Dq, q_lora_}, Init::normal(0.02f));
    } else {
      q_ = ck.get(p + "q_proj.weight", {H_ * Dq, D_}, Init::normal(0.02f));
    }
    kv_a_ = ck.get(p + "kv_a_proj_with_mqa.weight", {R_ + rope_dim_, D_}, Init::normal(0.02f));
    kv_a_bias_ = ck.get_optional(p + "kv_a_proj_with_mqa.bias", {R_ + rope_dim_}, Init::zeros());
    kv_a_norm_ = ck.get(p + "kv_a_layernorm.weight", {R_}, Init::ones());
    kv_b_ = ck.get(p + "kv_b_proj.weight", {H_ * (nope_ + vd_), R_}, Init::normal(0.02f));
    o_ = ck.get(p + "o_proj.weight", {D_, H_ * vd_}, Init::normal(0.02f));
    o_bias_ = ck.get_optional(p + "o_proj.bias", {D_}, Init::zeros());
    if (cfg.mla_output_gate) g_ = ck.get(p + "g_proj.weight", {H_ * vd_, D_}, Init::normal(0.02f));

    bool nope_family = cfg.family == Family::KimiLinear;
    if (cfg.family == Family::Dayzero) nope_family = cfg.raw.is_object() ? cfg.raw.value("mla_use_nope", true) : true;
    float mult = 1.f;
    if (!nope_family && rope_dim_ > 0) {
      RopeConfig rc = cfg.rope;
      rc.style = RopeStyle::Interleaved;
      rope_ = std::make_unique<Rope>(rc, rope_dim_);
      mult = rope_->softmax_scale_mult();
    }
    scale_ = float(1.0 / std::sqrt(double(Dq))) * mult;

    DZ_CHECK(layer >= 0 && size_t(layer) < cfg.layers.size(), p, ": layer ", layer, " outside the layer list");
    if (cfg.layers[size_t(layer)].has_indexer) indexer_ = std::make_unique<DsaIndexer>(cfg, ck, p + "indexer.");
  }

  std::unique_ptr<MixerState> make_state() const override { return std::make_unique<AttnCache>(); }

  void forward(const float* x, int64_t T, MixerState& st_base, float* out) const override {
    auto* st = dynamic_cast<AttnCache*>(&st_base);
    DZ_CHECK(st, "MLA mixer: state is not an attention cache");
    const int64_t pos0 = st->pos, S = pos0 + T, Dq = nope_ + rope_dim_;
    DZ_CHECK(int64_t(st->latent.size()) == pos0 * R_ && int64_t(st->k_pe.size()) == pos0 * rope_dim_,
             "MLA mixer: cache size does not match position ", pos0);

    // Queries [T, H, Dq]; q_resid [T, q_lora] feeds the indexer.
    std::vector<float> q(size_t(T * H_ * Dq)), q_resid;
    if (q_lora_ > 0) {
      q_resid.resize(size_t(T * q_lora_));
      linear(x, q_a_.ptr(), opt(q_a_bias_), q_resid.data(), T, D_, q_lora_);
      rmsnorm(q_resid.data(), q_a_norm_.ptr(), q_resid.data(), T, q_lora_, kLatentNormEps);
      linear(q_resid.data(), q_b_.ptr(), nullptr, q.data(), T, q_lora_, H_ * Dq);
    } else {
      linear(x, q_.ptr(), nullptr, q.data(), T, D_, H_ * Dq);
    }

    // Latent + shared rope key for the new tokens, appended to the cache.
    std::vector<float> kv(size_t(T * (R_ + rope_dim_)));  // [T, R + rope]
    linear(x, kv_a_.ptr(), opt(kv_a_bias_), kv.data(), T, D_, R_ + rope_dim_);
    st->latent.resize(size_t(S * R_));
    st->k_pe.resize(size_t(S * rope_dim_));
    for (int64_t t = 0; t < T; ++t) {
      const float* row = kv.data() + t * (R_ + rope_dim_);
      std::copy(row, row + R_, st->latent.data() + (pos0 + t) * R_);
      std::copy(row + R_, row + R_ + rope_dim_, st->k_pe.data() + (pos0 + t) * rope_dim_);
    }
    float* c_new = st->latent.data() + pos0 * R_;
    rmsnorm(c_new, kv_a_norm_.ptr(), c_new, T, R_, kLatentNormEps);
    if (rope_) {
      rope_->apply(q.data(), T, H_, Dq, nope_, pos0);
      rope_->apply(st->k_pe.data() + pos0 * rope_dim_, T, 1, rope_dim_, 0, pos0);
    }

    // DSA: Top-K key positions per query.
    const int32_t* sel = nullptr;
    int64_t n_sel = 0;
    if (indexer_) {
      n_sel = indexer_->topk();
      st->last_topk.assign(size_t(T * n_sel), -1);
      st->topk_width = n_sel;
      indexer_->forward(x, q_resid.data(), T, pos0, st->index_k, st->last_topk.data());
      sel = st->last_topk.data();
    }

    // Materialise per-head keys [S, H, Dq] and values [S, H, vd] from the latent cache.
    std::vector<float> kvb(size_t(S * H_ * (nope_ + vd_)));  // [S, H, nope + vd]
    linear(st->latent.data(), kv_b_.ptr(), nullptr, kvb.data(), S, R_, H_ * (nope_ + vd_));
    std::vector<float> k(size_t(S * H_ * Dq)), v(size_t(S * H_ * vd_));
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H_; ++h) {
        const float* src = kvb.data() + (s * H_ + h) * (nope_ + vd_);
        float* kd = k.data() + (s * H_ + h) * Dq;
        std::copy(src, src + nope_, kd);
        std::copy(st->k_pe.data() + s * rope_dim_, st->k_pe.data() + (s + 1) * rope_dim_, kd + nope_);
        std::copy(src + nope_, src + nope_ + vd_, v.data() + (s * H_ + h) * vd_);
      }

    std::vector<float> o(size_t(T * H_ * vd_));  // [T, H, vd]
    causal_attention(q.data(), k.data(), v.data(), o.data(), T, pos0, S, H_, H_, Dq, vd_, scale_, sel, n_sel);

    if (!g_.empty()) {
      std::vector<float> g(o.size());  // [T, H*vd]
      linear(x, g_.ptr(), nullptr, g.data(), T, D_, H_ * vd_);
      for (size_t i = 0; i < o.size(); ++i) o[i] *= sigmoid(g[i]);
    }
    linear(o.data(), o_.ptr(), opt(o_bias_), out, T, H_ * vd_, D_);
    st->pos = S;
  }

 private:
  int64_t D_ = 0, H_ = 0, q_lora_ = 0, R_ = 0, nope_ = 0, rope_dim_ = 0, vd_ = 0;
  float scale_ = 1.f;
  Tensor q_;                            // [H*Dq, D]        (q_lora_rank == 0)
  Tensor q_a_, q_a_bias_, q_a_norm_;    // [q_lora, D], [q_lora], [q_lora]
  Tensor q_b_;                          // [H*Dq, q_lora]
  Tensor kv_a_, kv_a_bias_, kv_a_norm_; // [R + rope, D], [R + rope], [R]
  Tensor kv_b_;                         // [H*(nope + vd), R]
  Tensor o_, o_bias_;                   // [D, H*vd], [D]
  Tensor g_;                            // [H*vd, D]        (output gate)
  std::unique_ptr<Rope> rope_;          // null: NoPE
  std::unique_ptr<DsaIndexer> indexer_; // null: dense
};

}  // namespace

std::unique_ptr<Mixer> make_mla_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp) {
  DZ_CHECK(tp.size == 1, "layer ", layer, ": tensor parallelism is not implemented for this mixer yet");
  return std::make_unique<MlaMixer>(cfg, layer, ck, prefix);
}

}  // namespace dz
