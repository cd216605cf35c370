// Gated grouped-query attention (Qwen3-Next full-attention layers).
//
// Per token (x = the layer's normed input), as transformers' qwen3_next:
//   q_proj(x) viewed [H, 2*Dh]: per head the first Dh are the query, the next Dh the gate
//   (interleaved per head, not two halves of the whole projection); without the output gate
//   q_proj is [H*Dh] plain.
//   q = q_norm(q), k = q_norm-style k_norm(k_proj(x)): zero-centred RMSNorm ((1 + w) weight,
//   eps rms_norm_eps) over each head's Dh.
//   RoPE, NeoX (rotate halves), on the first rot = Dh * partial_rotary_factor dims of each head.
//   o = softmax(q·k / sqrt(Dh)) v over the causal keys, GQA groups of H / Hkv query heads.
//   o *= sigmoid(gate);  out = o_proj(o)
// The cache keeps k (after norm and RoPE) and v per token.
#include <cmath>
#include <memory>

#include "core/error.hpp"
#include "core/linalg.hpp"
#include "model/module.hpp"
#include "ops/attention.hpp"
#include "ops/norm.hpp"
#include "ops/rope.hpp"

namespace dz {

namespace {

const float* opt(const Tensor& t) { return t.empty() ? nullptr : t.ptr(); }

class GqaMixer : public Mixer {
 public:
  GqaMixer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix) {
    D_ = cfg.hidden_size;
    H_ = cfg.num_heads;
    Hkv_ = cfg.num_kv_heads;
    Dh_ = cfg.head_dim;
    eps_ = cfg.rms_norm_eps;
    gated_ = cfg.attn_output_gate || cfg.family == Family::Qwen3Next;  // qwen3_next always gates
    // qwen3_next's q/k norms are always the zero-centred (Gemma-style) RMSNorm.
    zero_centered_ = cfg.family == Family::Qwen3Next || cfg.norm_zero_centered;
    const std::string p = prefix + "self_attn.";
    DZ_CHECK(D_ > 0 && H_ > 0 && Hkv_ > 0 && Dh_ > 0 && H_ % Hkv_ == 0, p, ": bad GQA dims (heads ", H_,
             ", kv heads ", Hkv_, ", head_dim ", Dh_, ")");
    const int64_t qw = H_ * Dh_ * (gated_ ? 2 : 1);
    const Init norm_init = zero_centered_ ? Init::zeros() : Init::ones();
    q_ = ck.get(p + "q_proj.weight", {qw, D_}, Init::normal(0.02f));
    q_bias_ = ck.get_optional(p + "q_proj.bias", {qw}, Init::zeros());
    k_ = ck.get(p + "k_proj.weight", {Hkv_ * Dh_, D_}, Init::normal(0.02f));
    k_bias_ = ck.get_optional(p + "k_proj.bias", {Hkv_ * Dh_}, Init::zeros());
    v_ = ck.get(p + "v_proj.weight", {Hkv_ * Dh_, D_}, Init::normal(0.02f));
    v_bias_ = ck.get_optional(p + "v_proj.bias", {Hkv_ * Dh_}, Init::zeros());
    o_ = ck.get(p + "o_proj.weight", {D_, H_ * Dh_}, Init::normal(0.02f));
    o_bias_ = ck.get_optional(p + "o_proj.bias", {D_}, Init::zeros());
    q_norm_ = ck.get(p + "q_norm.weight", {Dh_}, norm_init);
    k_norm_ = ck.get(p + "k_norm.weight", {Dh_}, norm_init);
    // transformers: dim = int(head_dim * partial_rotary_factor)
    const int64_t rot = int64_t(double(Dh_) * double(cfg.rope.partial_rotary_factor));
    DZ_CHECK(rot >= 0 && rot <= Dh_ && rot % 2 == 0, p, ": rotary dim ", rot, " must be even and <= head_dim");
    if (rot > 0) {
      RopeConfig rc = cfg.rope;
      rc.style = RopeStyle::NeoX;
      rope_ = std::make_unique<Rope>(rc, rot);
    }
    scale_ = float(1.0 / std::sqrt(double(Dh_)));
  }

  std::unique_ptr<MixerState> make_state() const override { return std::make_unique<AttnCache>(); }

  void forward(const float* x, int64_t T, MixerState& st_base, float* out) const override {
    auto* st = dynamic_cast<AttnCache*>(&st_base);
    DZ_CHECK(st, "GQA mixer: state is not an attention cache");
    const int64_t pos0 = st->pos, S = pos0 + T, kvw = Hkv_ * Dh_;
    DZ_CHECK(int64_t(st->k.size()) == pos0 * kvw && int64_t(st->v.size()) == pos0 * kvw,
             "GQA mixer: cache size does not match position ", pos0);

    const int64_t qw = H_ * Dh_ * (gated_ ? 2 : 1);
    std::vector<float> qg(size_t(T * qw));  // [T, H, (2)Dh]
    linear(x, q_.ptr(), opt(q_bias_), qg.data(), T, D_, qw);
    std::vector<float> q(size_t(T * H_ * Dh_)), gate;  // [T, H, Dh]
    if (gated_) {
      gate.resize(q.size());
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H_; ++h) {
          const float* src = qg.data() + (t * H_ + h) * 2 * Dh_;
          std::copy(src, src + Dh_, q.data() + (t * H_ + h) * Dh_);
          std::copy(src + Dh_, src + 2 * Dh_, gate.data() + (t * H_ + h) * Dh_);
        }
    } else {
      q.swap(qg);
    }
    rmsnorm(q.data(), q_norm_.ptr(), q.data(), T * H_, Dh_, eps_, zero_centered_);

    st->k.resize(size_t(S * kvw));
    st->v.resize(size_t(S * kvw));
    float* kn = st->k.data() + pos0 * kvw;  // [T, Hkv, Dh]
    linear(x, k_.ptr(), opt(k_bias_), kn, T, D_, kvw);
    linear(x, v_.ptr(), opt(v_bias_), st->v.data() + pos0 * kvw, T, D_, kvw);
    rmsnorm(kn, k_norm_.ptr(), kn, T * Hkv_, Dh_, eps_, zero_centered_);
    if (rope_) {
      rope_->apply(q.data(), T, H_, Dh_, 0, pos0);
      rope_->apply(kn, T, Hkv_, Dh_, 0, pos0);
    }

    std::vector<float> o(size_t(T * H_ * Dh_));  // [T, H, Dh]
    causal_attention(q.data(), st->k.data(), st->v.data(), o.data(), T, pos0, S, H_, Hkv_, Dh_, Dh_, scale_);
    if (gated_)
      for (size_t i = 0; i < o.size(); ++i) o[i] *= sigmoid(gate[i]);
    linear(o.data(), o_.ptr(), opt(o_bias_), out, T, H_ * Dh_, D_);
    st->pos = S;
  }

 private:
  int64_t D_ = 0, H_ = 0, Hkv_ = 0, Dh_ = 0;
  float eps_ = 1e-6f, scale_ = 1.f;
  bool gated_ = true, zero_centered_ = true;
  Tensor q_, q_bias_;      // [H*Dh*(2 if gated), D]
  Tensor k_, k_bias_;      // [Hkv*Dh, D]
  Tensor v_, v_bias_;      // [Hkv*Dh, D]
  Tensor o_, o_bias_;      // [D, H*Dh]
  Tensor q_norm_, k_norm_; // [Dh]
  std::unique_ptr<Rope> rope_;
};

}  // namespace

std::unique_ptr<Mixer> make_gqa_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp) {
  DZ_CHECK(tp.size == 1, "layer ", layer, ": tensor parallelism is not implemented for this mixer yet");
  (void)layer;  // every qwen3_next full-attention layer has the same structure
  return std::make_unique<GqaMixer>(cfg, ck, prefix);
}

}  // namespace dz
