// Gated DeltaNet token mixer (Qwen3-Next): fused input projections, one short conv over q|k|v,
// scalar-gated delta rule, SiLU-gated RMSNorm, output projection. Tensor names are qwen3_next's:
// PREFIX linear_attn.{in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj}.
//
// TP shards the key heads [h0, h1) and with them their value heads [h0*r, h1*r) (r = HV / HK).
// Both fused projections are laid out per key head (in_proj_qkvz: [q K | k K | v r*V | z r*V],
// in_proj_ba: [b r | a r], as fix_query_key_value_ordering splits them), so a key-head range is
// one contiguous row range of each; conv1d's channels are [q all | k all | v all], so its three
// parts are sliced separately; dt_bias, A_log per value head; out_proj by columns; norm replicated.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/linalg.hpp"
#include "model/la_mixer.hpp"
#include "model/module.hpp"
#include "ops/linear_attn.hpp"
#include "ops/norm.hpp"
#include "ops/short_conv.hpp"

namespace dz {
namespace {

// Conv weight [C, 1, W] as published, [C, W] accepted too (same data); generated models use [C, 1, W].
Tensor get_conv(Checkpoint& ck, const std::string& name, int64_t C, int64_t W, Init init) {
  Shape s{C, 1, W};
  if (!ck.generating() && ck.has(name) && ck.info(name).shape == Shape{C, W}) s = {C, W};
  Tensor t = ck.get(name, s, init);
  t.reshape({C, W});
  return t;
}

class GdnMixer : public LinearAttnMixer {
 public:
  GdnMixer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, const TpShard& tp) {
    const int64_t HKf = cfg.la_num_k_heads, HVf = cfg.la_num_v_heads;  // heads of the whole layer
    K_ = cfg.la_head_k_dim;
    V_ = cfg.la_head_v_dim;
    D_ = cfg.hidden_size;
    W_ = cfg.la_conv_kernel;
    eps_ = cfg.rms_norm_eps;
    name_ = "GDN";
    per_channel_ = false;
    act_ = GateAct::SiLU;
    DZ_CHECK(HKf > 0 && HVf > 0 && K_ > 0 && V_ > 0 && D_ > 0 && W_ > 0, "GDN layer ", prefix,
             ": bad linear-attention sizes");
    DZ_CHECK(HVf % HKf == 0, "GDN layer ", prefix, ": value heads ", HVf, " not a multiple of key heads ", HKf);
    r_ = HVf / HKf;
    const std::string what = "GDN layer " + prefix + ": key heads (linear_num_key_heads)";
    const auto range = tp.range(HKf, what.c_str());
    // Generating mode (make-model) must see the full tensors: keep them all and reduce nothing.
    const bool shard = tp.size > 1 && !ck.generating();
    const int64_t h0 = shard ? range.first : 0, h1 = shard ? range.second : HKf;
    HK_ = h1 - h0;
    HV_ = HK_ * r_;
    if (shard) tp_ = tp;
    auto rows = [&](Tensor t, int64_t per_key_head) {
      return shard ? slice_rows(t, h0 * per_key_head, h1 * per_key_head) : t;
    };

    const std::string p = prefix + "linear_attn.";
    const Init proj = Init::normal(0.02f);
    const float cb = 1.f / std::sqrt(float(W_));
    w_qkvz_ = rows(ck.get(p + "in_proj_qkvz.weight", {2 * HKf * K_ + 2 * HVf * V_, D_}, proj), 2 * K_ + 2 * r_ * V_);
    w_ba_ = rows(ck.get(p + "in_proj_ba.weight", {2 * HVf, D_}, proj), 2 * r_);
    conv_ = get_conv(ck, p + "conv1d.weight", 2 * HKf * K_ + HVf * V_, W_, Init::uniform(-cb, cb));
    if (shard) {  // [q | k | v] channel groups, each cut to this rank's heads
      const int64_t KDf = HKf * K_;
      Tensor c({conv_dim(), W_});
      const std::pair<int64_t, int64_t> parts[3] = {{h0 * K_, h1 * K_},
                                                     {KDf + h0 * K_, KDf + h1 * K_},
                                                     {2 * KDf + h0 * r_ * V_, 2 * KDf + h1 * r_ * V_}};
      auto dst = c.data.begin();
      for (const auto& pr : parts) dst = std::copy(conv_.data.begin() + pr.first * W_, conv_.data.begin() + pr.second * W_, dst);
      conv_ = std::move(c);
    }
    dt_bias_ = rows(ck.get(p + "dt_bias", {HVf}, Init::uniform(-4.f, -1.f)), r_);
    A_log_ = rows(ck.get(p + "A_log", {HVf}, Init::uniform(0.f, std::log(16.f))), r_);
    // qwen3_next's gated norm is weight * x (ones init), not zero-centred like its other RMSNorms.
    out_norm_ = ck.get(p + "norm.weight", {V_}, Init::ones());
    wo_ = ck.get(p + "out_proj.weight", {D_, HVf * V_}, proj);
    if (shard) wo_ = slice_cols(wo_, h0 * r_ * V_, h1 * r_ * V_);
  }

 private:
  Tok project(const float* x, int64_t T) const override {
    const int64_t r = r_, KD = HK_ * K_, VD = HV_ * V_, QKVZ = 2 * KD + 2 * VD, CD = conv_dim();
    std::vector<float> qkvz(size_t(T * QKVZ)), ba(size_t(T * 2 * HV_));
    linear(x, w_qkvz_.ptr(), nullptr, qkvz.data(), T, D_, QKVZ);
    linear(x, w_ba_.ptr(), nullptr, ba.data(), T, D_, 2 * HV_);
    // Un-interleave as fix_query_key_value_ordering: per key head h the projection holds
    // [q (K) | k (K) | v (r*V) | z (r*V)], and in_proj_ba holds [b (r) | a (r)]; value head h*r+i
    // is the i-th of its group. pre = [q all heads | k all heads | v all heads] for the conv.
    Tok tk;
    tk.pre.resize(size_t(T * CD));
    tk.gate.resize(size_t(T * VD));
    tk.beta.resize(size_t(T * HV_));
    std::vector<float> a(size_t(T * HV_));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < HK_; ++h) {
        const float* grp = qkvz.data() + t * QKVZ + h * (2 * K_ + 2 * r * V_);
        float* m = tk.pre.data() + t * CD;
        for (int64_t i = 0; i < K_; ++i) {
          m[h * K_ + i] = grp[i];
          m[KD + h * K_ + i] = grp[K_ + i];
        }
        for (int64_t i = 0; i < r * V_; ++i) {
          m[2 * KD + h * r * V_ + i] = grp[2 * K_ + i];
          tk.gate[size_t(t * VD + h * r * V_ + i)] = grp[2 * K_ + r * V_ + i];
        }
        const float* bag = ba.data() + t * 2 * HV_ + h * 2 * r;
        for (int64_t i = 0; i < r; ++i) {
          tk.beta[size_t(t * HV_ + h * r + i)] = sigmoid(bag[i]);
          a[size_t(t * HV_ + h * r + i)] = bag[r + i];
        }
      }
    tk.g.resize(size_t(T * HV_));
    kda_gate_softplus(a.data(), A_log_.ptr(), dt_bias_.ptr(), T, HV_, 1, tk.g.data());  // -exp(A_log) softplus(a + dt_bias)
    return tk;
  }

  int64_t r_ = 1;             // value heads per key head
  Tensor w_qkvz_, w_ba_;      // [2*HK*K + 2*HV*V, D], [2*HV, D]: this rank's key-head groups
  Tensor dt_bias_, A_log_;    // [HV], [HV]; out_norm_ (norm) [V] replicated
};

}  // namespace

std::unique_ptr<Mixer> make_gdn_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp) {
  (void)layer;
  DZ_CHECK(cfg.family == Family::Qwen3Next, "GDN layer ", prefix, ": no Gated DeltaNet tensor names for model_type '",
           cfg.model_type, "'");
  return std::make_unique<GdnMixer>(cfg, ck, prefix, tp);
}

}  // namespace dz
