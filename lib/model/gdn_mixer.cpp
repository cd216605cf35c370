// Gated DeltaNet token mixer (Qwen3-Next): fused input projections, one short conv over q|k|v,
// scalar-gated delta rule, SiLU-gated RMSNorm, output projection. Tensor names are qwen3_next's:
// PREFIX linear_attn.{in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj}.
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/linalg.hpp"
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

class GdnMixer : public Mixer {
 public:
  GdnMixer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix) {
    HK_ = cfg.la_num_k_heads;
    HV_ = cfg.la_num_v_heads;
    K_ = cfg.la_head_k_dim;
    V_ = cfg.la_head_v_dim;
    D_ = cfg.hidden_size;
    W_ = cfg.la_conv_kernel;
    eps_ = cfg.rms_norm_eps;
    DZ_CHECK(HK_ > 0 && HV_ > 0 && K_ > 0 && V_ > 0 && D_ > 0 && W_ > 0, "GDN layer ", prefix,
             ": bad linear-attention sizes");
    DZ_CHECK(HV_ % HK_ == 0, "GDN layer ", prefix, ": value heads ", HV_, " not a multiple of key heads ", HK_);
    const std::string p = prefix + "linear_attn.";
    const Init proj = Init::normal(0.02f);
    const float cb = 1.f / std::sqrt(float(W_));
    w_qkvz_ = ck.get(p + "in_proj_qkvz.weight", {2 * HK_ * K_ + 2 * HV_ * V_, D_}, proj);
    w_ba_ = ck.get(p + "in_proj_ba.weight", {2 * HV_, D_}, proj);
    conv_ = get_conv(ck, p + "conv1d.weight", conv_dim(), W_, Init::uniform(-cb, cb));
    dt_bias_ = ck.get(p + "dt_bias", {HV_}, Init::uniform(-4.f, -1.f));
    A_log_ = ck.get(p + "A_log", {HV_}, Init::uniform(0.f, std::log(16.f)));
    // qwen3_next's gated norm is weight * x (ones init), not zero-centred like its other RMSNorms.
    norm_ = ck.get(p + "norm.weight", {V_}, Init::ones());
    wo_ = ck.get(p + "out_proj.weight", {D_, HV_ * V_}, proj);
  }

  std::unique_ptr<MixerState> make_state() const override {
    auto st = std::make_unique<LaState>();
    st->S = Tensor({HV_, K_, V_});
    st->conv = {Tensor({W_ - 1, conv_dim()})};
    return st;
  }

  void forward(const float* x, int64_t T, MixerState& base, float* out) const override {
    auto* st = dynamic_cast<LaState*>(&base);
    DZ_CHECK(st && st->conv.size() == 1, "GDN mixer: state of another mixer kind");
    const int64_t r = HV_ / HK_, KD = HK_ * K_, VD = HV_ * V_, QKVZ = 2 * KD + 2 * VD, CD = conv_dim();
    std::vector<float> qkvz(size_t(T * QKVZ)), ba(size_t(T * 2 * HV_));
    linear(x, w_qkvz_.ptr(), nullptr, qkvz.data(), T, D_, QKVZ);
    linear(x, w_ba_.ptr(), nullptr, ba.data(), T, D_, 2 * HV_);

    // Un-interleave as fix_query_key_value_ordering: per key head h the projection holds
    // [q (K) | k (K) | v (r*V) | z (r*V)], and in_proj_ba holds [b (r) | a (r)]; value head h*r+i
    // is the i-th of its group. mixed = [q all heads | k all heads | v all heads] for the conv.
    std::vector<float> mixed(size_t(T * CD)), z(size_t(T * VD)), b(size_t(T * HV_)), a(size_t(T * HV_));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < HK_; ++h) {
        const float* grp = qkvz.data() + t * QKVZ + h * (2 * K_ + 2 * r * V_);
        float* m = mixed.data() + t * CD;
        for (int64_t i = 0; i < K_; ++i) {
          m[h * K_ + i] = grp[i];
          m[KD + h * K_ + i] = grp[K_ + i];
        }
        for (int64_t i = 0; i < r * V_; ++i) {
          m[2 * KD + h * r * V_ + i] = grp[2 * K_ + i];
          z[size_t(t * VD + h * r * V_ + i)] = grp[2 * K_ + r * V_ + i];
        }
        const float* bag = ba.data() + t * 2 * HV_ + h * 2 * r;
        for (int64_t i = 0; i < r; ++i) {
          b[size_t(t * HV_ + h * r + i)] = bag[i];
          a[size_t(t * HV_ + h * r + i)] = bag[r + i];
        }
      }
    std::vector<float> conv_out(size_t(T * CD));
    short_conv_silu(mixed.data(), conv_.ptr(), nullptr, T, CD, W_, st->conv[0].ptr(), conv_out.data());
    std::vector<float> q(size_t(T * KD)), k(size_t(T * KD)), v(size_t(T * VD));
    for (int64_t t = 0; t < T; ++t) {
      const float* c = conv_out.data() + t * CD;
      for (int64_t i = 0; i < KD; ++i) {
        q[size_t(t * KD + i)] = c[i];
        k[size_t(t * KD + i)] = c[KD + i];
      }
      for (int64_t i = 0; i < VD; ++i) v[size_t(t * VD + i)] = c[2 * KD + i];
    }
    l2norm(q.data(), q.data(), T * HK_, K_, 1e-6f);
    l2norm(k.data(), k.data(), T * HK_, K_, 1e-6f);
    for (auto& e : b) e = sigmoid(e);
    std::vector<float> g(size_t(T * HV_));
    kda_gate_softplus(a.data(), A_log_.ptr(), dt_bias_.ptr(), T, HV_, 1, g.data());  // -exp(A_log) softplus(a + dt_bias)

    std::vector<float> o(size_t(T * VD));
    const float scale = 1.f / std::sqrt(float(K_));
    if (T >= kLaChunk)
      gdn_chunked(q.data(), k.data(), v.data(), g.data(), b.data(), T, HK_, HV_, K_, V_, scale, st->S.ptr(), o.data());
    else
      gdn_recurrent(q.data(), k.data(), v.data(), g.data(), b.data(), T, HK_, HV_, K_, V_, scale, st->S.ptr(),
                    o.data());
    gated_rmsnorm(o.data(), z.data(), norm_.ptr(), o.data(), T * HV_, V_, eps_, GateAct::SiLU);
    linear(o.data(), wo_.ptr(), nullptr, out, T, VD, D_);
    st->pos += T;
  }

 private:
  int64_t conv_dim() const { return 2 * HK_ * K_ + HV_ * V_; }
  int64_t HK_, HV_, K_, V_, D_, W_;
  float eps_;
  Tensor w_qkvz_, w_ba_;      // [2*HK*K + 2*HV*V, D], [2*HV, D]
  Tensor conv_;               // [2*HK*K + HV*V, W]
  Tensor dt_bias_, A_log_;    // [HV], [HV]
  Tensor norm_;               // [V]
  Tensor wo_;                 // [D, HV*V]
};

}  // namespace

std::unique_ptr<Mixer> make_gdn_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp) {
  DZ_CHECK(tp.size == 1, "layer ", layer, ": tensor parallelism is not implemented for this mixer yet");
  (void)layer;
  DZ_CHECK(cfg.family == Family::Qwen3Next, "GDN layer ", prefix, ": no Gated DeltaNet tensor names for model_type '",
           cfg.model_type, "'");
  return std::make_unique<GdnMixer>(cfg, ck, prefix);
}

}  // namespace dz
