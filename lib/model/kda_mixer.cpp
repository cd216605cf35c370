// KDA token mixer (Kimi Linear / K3 / dayzero): projections, short convs, gate, delta rule,
// gated output norm, output projection. Tensor names are the published kimi_linear ones
// (moonshotai/Kimi-Linear-48B-A3B: PREFIX self_attn.{q,k,v}_proj, {q,k,v}_conv1d, A_log, dt_bias,
// f_a_proj, f_b_proj, b_proj, g_a_proj, g_b_proj, o_norm, o_proj); the dayzero family uses the same.
//
// TP shards the heads: a rank keeps heads [h0, h1) of q/k/v_proj, the three convs, A_log, dt_bias,
// f_b_proj, b_proj, g_b_proj (rows) and of o_proj (columns); the low-rank first factors f_a_proj,
// g_a_proj and o_norm are replicated; the partial o_proj outputs are all-reduced over the TP group.
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

// A tensor whose published layout varies between exporters only by unit dims (A_log [1, 1, H, 1]
// vs [H]; conv weight [C, 1, W] vs [C, W]): a real checkpoint may hold any of `alts`; generated
// models use alts[0]. Anything else is the usual strict shape error.
Tensor get_alt(Checkpoint& ck, const std::string& name, const std::vector<Shape>& alts, Init init) {
  if (!ck.generating() && ck.has(name))
    for (const Shape& s : alts)
      if (ck.info(name).shape == s) {
        Tensor t = ck.get(name, s, init);
        t.reshape(alts.back());
        return t;
      }
  Tensor t = ck.get(name, alts[0], init);
  t.reshape(alts.back());
  return t;
}

class KdaMixer : public LinearAttnMixer {
 public:
  KdaMixer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, const TpShard& tp) {
    const int64_t Hf = cfg.la_num_k_heads;  // heads of the whole layer
    K_ = cfg.la_head_k_dim;
    V_ = cfg.la_head_v_dim;
    D_ = cfg.hidden_size;
    W_ = cfg.la_conv_kernel;
    eps_ = cfg.rms_norm_eps;
    name_ = "KDA";
    per_channel_ = true;
    act_ = GateAct::Sigmoid;
    gate_ = cfg.kda_gate;
    lower_bound_ = cfg.kda_gate_lower_bound;
    DZ_CHECK(Hf > 0 && K_ > 0 && V_ > 0 && D_ > 0 && W_ > 0, "KDA layer ", prefix, ": bad linear-attention sizes");
    DZ_CHECK(cfg.la_num_v_heads == Hf, "KDA layer ", prefix, ": value heads ", cfg.la_num_v_heads,
             " != key heads ", Hf, " (kimi_linear has one head count)");
    const std::string what = "KDA layer " + prefix + ": heads (la_num_k_heads)";
    const auto range = tp.range(Hf, what.c_str());
    // Generating mode (make-model) must see the full tensors: keep them all and reduce nothing.
    const bool shard = tp.size > 1 && !ck.generating();
    const int64_t h0 = shard ? range.first : 0, h1 = shard ? range.second : Hf;
    H_ = HK_ = HV_ = h1 - h0;
    if (shard) tp_ = tp;
    auto rows = [&](Tensor t, int64_t per_head) { return shard ? slice_rows(t, h0 * per_head, h1 * per_head) : t; };

    const std::string p = prefix + "self_attn.";
    const int64_t HKf = Hf * K_, HVf = Hf * V_;
    const Init proj = Init::normal(0.02f);
    const float cb = 1.f / std::sqrt(float(W_));  // torch Conv1d default init bound
    wq_ = rows(ck.get(p + "q_proj.weight", {HKf, D_}, proj), K_);
    wk_ = rows(ck.get(p + "k_proj.weight", {HKf, D_}, proj), K_);
    wv_ = rows(ck.get(p + "v_proj.weight", {HVf, D_}, proj), V_);
    const Tensor cq = rows(get_alt(ck, p + "q_conv1d.weight", {{HKf, 1, W_}, {HKf, W_}}, Init::uniform(-cb, cb)), K_);
    const Tensor ckw = rows(get_alt(ck, p + "k_conv1d.weight", {{HKf, 1, W_}, {HKf, W_}}, Init::uniform(-cb, cb)), K_);
    const Tensor cv = rows(get_alt(ck, p + "v_conv1d.weight", {{HVf, 1, W_}, {HVf, W_}}, Init::uniform(-cb, cb)), V_);
    conv_ = Tensor({conv_dim(), W_});  // [q | k | v] channels, one depthwise conv
    std::copy(cq.data.begin(), cq.data.end(), conv_.data.begin());
    std::copy(ckw.data.begin(), ckw.data.end(), conv_.data.begin() + cq.size());
    std::copy(cv.data.begin(), cv.data.end(), conv_.data.begin() + cq.size() + ckw.size());
    // A_log: exp(A_log) in [1, 16] as Kimi's init; dt_bias around inverse-softplus of small dt.
    A_log_ = rows(get_alt(ck, p + "A_log", {{1, 1, Hf, 1}, {Hf, 1}, {Hf}}, Init::uniform(0.f, std::log(16.f))), 1);
    dt_bias_ = rows(get_alt(ck, p + "dt_bias", {{HKf}, {Hf, K_}, {HKf}}, Init::uniform(-4.f, -1.f)), K_);
    f_a_ = ck.get(p + "f_a_proj.weight", {K_, D_}, proj);
    f_b_ = rows(ck.get(p + "f_b_proj.weight", {HKf, K_}, proj), K_);
    b_ = rows(ck.get(p + "b_proj.weight", {Hf, D_}, proj), 1);
    g_a_ = ck.get(p + "g_a_proj.weight", {V_, D_}, proj);
    g_b_ = rows(ck.get(p + "g_b_proj.weight", {HVf, V_}, proj), V_);
    out_norm_ = ck.get(p + "o_norm.weight", {V_}, Init::ones());
    wo_ = ck.get(p + "o_proj.weight", {D_, HVf}, proj);
    if (shard) wo_ = slice_cols(wo_, h0 * V_, h1 * V_);
  }

 private:
  Tok project(const float* x, int64_t T) const override {
    const int64_t HK = H_ * K_, HV = H_ * V_, CD = conv_dim();
    Tok tk;
    tk.pre.resize(size_t(T * CD));
    std::vector<float> tmp(size_t(T * std::max(HK, HV)));
    const Tensor* w[3] = {&wq_, &wk_, &wv_};
    const int64_t width[3] = {HK, HK, HV}, col0[3] = {0, HK, 2 * HK};
    for (int part = 0; part < 3; ++part) {
      linear(x, w[part]->ptr(), nullptr, tmp.data(), T, D_, width[part]);
      for (int64_t t = 0; t < T; ++t)
        std::copy(tmp.begin() + t * width[part], tmp.begin() + (t + 1) * width[part],
                  tk.pre.begin() + t * CD + col0[part]);
    }
    // per-channel log-decay from the low-rank gate projection
    std::vector<float> low(size_t(T * std::max(K_, V_))), f(size_t(T * HK));
    tk.g.resize(size_t(T * HK));
    linear(x, f_a_.ptr(), nullptr, low.data(), T, D_, K_);
    linear(low.data(), f_b_.ptr(), nullptr, f.data(), T, K_, HK);
    if (gate_ == KdaGate::Softplus)
      kda_gate_softplus(f.data(), A_log_.ptr(), dt_bias_.ptr(), T, H_, K_, tk.g.data());
    else
      kda_gate_lower_bound(f.data(), A_log_.ptr(), dt_bias_.ptr(), lower_bound_, T, H_, K_, tk.g.data());
    tk.beta.resize(size_t(T * H_));
    linear(x, b_.ptr(), nullptr, tk.beta.data(), T, D_, H_);
    for (auto& b : tk.beta) b = sigmoid(b);
    // output gate (low rank)
    tk.gate.resize(size_t(T * HV));
    linear(x, g_a_.ptr(), nullptr, low.data(), T, D_, V_);
    linear(low.data(), g_b_.ptr(), nullptr, tk.gate.data(), T, V_, HV);
    return tk;
  }

  int64_t H_ = 0;             // heads on this TP rank (KDA has one head count: HK_ = HV_ = H_)
  float lower_bound_;
  KdaGate gate_;
  Tensor wq_, wk_, wv_;       // [H*K, D], [H*K, D], [H*V, D]; conv_ stacks the q, k, v convs
  Tensor A_log_, dt_bias_;    // [H], [H*K]
  Tensor f_a_, f_b_, b_;      // [K, D] (replicated), [H*K, K], [H, D]
  Tensor g_a_, g_b_;          // [V, D] (replicated), [H*V, V]; out_norm_ o_norm [V]
};

}  // namespace

std::unique_ptr<Mixer> make_kda_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp) {
  (void)layer;
  DZ_CHECK(cfg.family == Family::KimiLinear || cfg.family == Family::Dayzero, "KDA layer ", prefix,
           ": no KDA tensor names for model_type '", cfg.model_type, "'");
  return std::make_unique<KdaMixer>(cfg, ck, prefix, tp);
}

}  // namespace dz
