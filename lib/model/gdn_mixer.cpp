// Gated DeltaNet token mixer (Qwen3-Next, Qwen3.5): input projections, one short conv over q|k|v,
// scalar-gated delta rule, SiLU-gated RMSNorm, output projection. Tensor names are qwen3_next's:
// PREFIX linear_attn.{in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj}; Qwen3.5
// publishes the projections separately, already de-interleaved: in_proj_qkv [q all | k all | v all],
// in_proj_z, in_proj_b, in_proj_a (value head j belongs to key head j / r in both).
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
  GdnMixer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, const TpShard& tp, Backend& be) {
    be_ = &be;
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
    const bool shard = tp.size > 1 && !ck.keeps_full();
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
    Tensor w_qkvz, w_ba, w_qkv, w_z, w_b, w_a;
    if (cfg.gdn_split_proj) {  // Qwen3.5: [q all | k all | v all], z, b, a as separate tensors
      w_qkv = ck.get(p + "in_proj_qkv.weight", {2 * HKf * K_ + HVf * V_, D_}, proj);
      w_z = rows(ck.get(p + "in_proj_z.weight", {HVf * V_, D_}, proj), r_ * V_);
      w_b = rows(ck.get(p + "in_proj_b.weight", {HVf, D_}, proj), r_);
      w_a = rows(ck.get(p + "in_proj_a.weight", {HVf, D_}, proj), r_);
    } else {
      w_qkvz = rows(ck.get(p + "in_proj_qkvz.weight", {2 * HKf * K_ + 2 * HVf * V_, D_}, proj), 2 * K_ + 2 * r_ * V_);
      w_ba = rows(ck.get(p + "in_proj_ba.weight", {2 * HVf, D_}, proj), 2 * r_);
    }
    // This rank's [q | k | v] channels of a [q all | k all | v all] tensor (rows of W values each).
    auto qkv_part = [&](const Tensor& t, int64_t W) {
      if (!shard || t.empty()) return t;
      const int64_t KDf = HKf * K_;
      Tensor c({conv_dim(), W});
      const std::pair<int64_t, int64_t> parts[3] = {{h0 * K_, h1 * K_},
                                                     {KDf + h0 * K_, KDf + h1 * K_},
                                                     {2 * KDf + h0 * r_ * V_, 2 * KDf + h1 * r_ * V_}};
      auto dst = c.data.begin();
      for (const auto& pr : parts) dst = std::copy(t.data.begin() + pr.first * W, t.data.begin() + pr.second * W, dst);
      return c;
    };
    Tensor conv = get_conv(ck, p + "conv1d.weight", 2 * HKf * K_ + HVf * V_, W_, Init::uniform(-cb, cb));
    conv = qkv_part(conv, W_);  // [q | k | v] channel groups, each cut to this rank's heads
    const Tensor dt_bias = rows(ck.get(p + "dt_bias", {HVf}, Init::uniform(-4.f, -1.f)), r_);
    const Tensor A_log = rows(ck.get(p + "A_log", {HVf}, Init::uniform(0.f, std::log(16.f))), r_);
    // qwen3_next's gated norm is weight * x (ones init), not zero-centred like its other RMSNorms.
    const Tensor norm = ck.get(p + "norm.weight", {V_}, Init::ones());
    Tensor wo = ck.get(p + "out_proj.weight", {D_, HVf * V_}, proj);
    if (shard) wo = slice_cols(wo, h0 * r_ * V_, h1 * r_ * V_);
    if (wo.empty()) return;  // dry run (inspect): names and shapes only
    if (cfg.gdn_split_proj) {  // already de-interleaved
      w_pre_ = be.weight(qkv_part(w_qkv, D_));
      w_z_ = be.weight(w_z);
      w_b_ = be.weight(w_b);
      w_a_ = be.weight(w_a);
      upload_rest(be, conv, dt_bias, A_log, norm, wo);
      return;
    }

    // Un-interleave the fused projections once, here, as fix_query_key_value_ordering splits their
    // outputs: per key head h in_proj_qkvz holds [q (K) | k (K) | v (r*V) | z (r*V)] and in_proj_ba
    // [b (r) | a (r)]; value head h*r+i is the i-th of its group. Permuting weight rows leaves every
    // output value unchanged and gives contiguous [q all | k all | v all] (what the conv reads), z,
    // b and a.
    const int64_t KD = HK_ * K_, VD = HV_ * V_, G = 2 * K_ + 2 * r_ * V_;
    Tensor pre({conv_dim(), D_}), z({VD, D_}), bw({HV_, D_}), aw({HV_, D_});
    auto put = [&](Tensor& dst, int64_t drow, const Tensor& src, int64_t srow, int64_t n) {
      std::copy(src.data.begin() + srow * D_, src.data.begin() + (srow + n) * D_, dst.data.begin() + drow * D_);
    };
    for (int64_t h = 0; h < HK_; ++h) {
      put(pre, h * K_, w_qkvz, h * G, K_);
      put(pre, KD + h * K_, w_qkvz, h * G + K_, K_);
      put(pre, 2 * KD + h * r_ * V_, w_qkvz, h * G + 2 * K_, r_ * V_);
      put(z, h * r_ * V_, w_qkvz, h * G + 2 * K_ + r_ * V_, r_ * V_);
      put(bw, h * r_, w_ba, h * 2 * r_, r_);
      put(aw, h * r_, w_ba, h * 2 * r_ + r_, r_);
    }
    w_pre_ = be.weight(pre);
    w_z_ = be.weight(z);
    w_b_ = be.weight(bw);
    w_a_ = be.weight(aw);
    upload_rest(be, conv, dt_bias, A_log, norm, wo);
  }

 private:
  void upload_rest(Backend& be, const Tensor& conv, const Tensor& dt_bias, const Tensor& A_log, const Tensor& norm,
                   const Tensor& wo) {
    conv_ = be.weight(conv);
    dt_bias_ = be.param(dt_bias);
    A_log_ = be.param(A_log);
    out_norm_ = be.param(norm);
    wo_ = be.weight(wo);
  }

  Tok project(const DTensor& x) const override {
    const int64_t T = x.rows();
    Backend& be = *be_;
    Tok tk;
    tk.pre = be.act({T, conv_dim()});
    be.linear(x, w_pre_, DTensor{}, tk.pre);
    tk.gate = be.act({T, HV_ * V_});
    be.linear(x, w_z_, DTensor{}, tk.gate);
    tk.beta = be.act({T, HV_});
    be.linear(x, w_b_, DTensor{}, tk.beta);
    tk.f = be.act({T, HV_});  // the gate: -exp(A_log) softplus(a + dt_bias)
    be.linear(x, w_a_, DTensor{}, tk.f);
    return tk;
  }

  int64_t r_ = 1;                   // value heads per key head
  DTensor w_pre_, w_z_, w_b_, w_a_;  // [2*HK*K + HV*V, D], [HV*V, D], [HV, D], [HV, D]: this rank's heads, de-interleaved
};

}  // namespace

std::unique_ptr<Mixer> make_gdn_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp, Backend& be) {
  (void)layer;
  DZ_CHECK(cfg.family == Family::Qwen3Next, "GDN layer ", prefix, ": no Gated DeltaNet tensor names for model_type '",
           cfg.model_type, "'");
  return std::make_unique<GdnMixer>(cfg, ck, prefix, tp, be);
}

}  // namespace dz
