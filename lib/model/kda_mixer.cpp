// KDA token mixer (Kimi Linear / K3 / dayzero): projections, short convs, gate, delta rule,
// gated output norm, output projection. Tensor names are the published kimi_linear ones
// (moonshotai/Kimi-Linear-48B-A3B: PREFIX self_attn.{q,k,v}_proj, {q,k,v}_conv1d, A_log, dt_bias,
// f_a_proj, f_b_proj, b_proj, g_a_proj, g_b_proj, o_norm, o_proj); the dayzero family uses the same.
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

class KdaMixer : public Mixer {
 public:
  KdaMixer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix) {
    H_ = cfg.la_num_k_heads;
    K_ = cfg.la_head_k_dim;
    V_ = cfg.la_head_v_dim;
    D_ = cfg.hidden_size;
    W_ = cfg.la_conv_kernel;
    eps_ = cfg.rms_norm_eps;
    gate_ = cfg.kda_gate;
    lower_bound_ = cfg.kda_gate_lower_bound;
    DZ_CHECK(H_ > 0 && K_ > 0 && V_ > 0 && D_ > 0 && W_ > 0, "KDA layer ", prefix, ": bad linear-attention sizes");
    DZ_CHECK(cfg.la_num_v_heads == H_, "KDA layer ", prefix, ": value heads ", cfg.la_num_v_heads,
             " != key heads ", H_, " (kimi_linear has one head count)");
    const std::string p = prefix + "self_attn.";
    const int64_t HK = H_ * K_, HV = H_ * V_;
    const Init proj = Init::normal(0.02f);
    const float cb = 1.f / std::sqrt(float(W_));  // torch Conv1d default init bound
    wq_ = ck.get(p + "q_proj.weight", {HK, D_}, proj);
    wk_ = ck.get(p + "k_proj.weight", {HK, D_}, proj);
    wv_ = ck.get(p + "v_proj.weight", {HV, D_}, proj);
    cq_ = get_alt(ck, p + "q_conv1d.weight", {{HK, 1, W_}, {HK, W_}}, Init::uniform(-cb, cb));
    ck_ = get_alt(ck, p + "k_conv1d.weight", {{HK, 1, W_}, {HK, W_}}, Init::uniform(-cb, cb));
    cv_ = get_alt(ck, p + "v_conv1d.weight", {{HV, 1, W_}, {HV, W_}}, Init::uniform(-cb, cb));
    // A_log: exp(A_log) in [1, 16] as Kimi's init; dt_bias around inverse-softplus of small dt.
    A_log_ = get_alt(ck, p + "A_log", {{1, 1, H_, 1}, {H_, 1}, {H_}}, Init::uniform(0.f, std::log(16.f)));
    dt_bias_ = get_alt(ck, p + "dt_bias", {{HK}, {H_, K_}, {HK}}, Init::uniform(-4.f, -1.f));
    f_a_ = ck.get(p + "f_a_proj.weight", {K_, D_}, proj);
    f_b_ = ck.get(p + "f_b_proj.weight", {HK, K_}, proj);
    b_ = ck.get(p + "b_proj.weight", {H_, D_}, proj);
    g_a_ = ck.get(p + "g_a_proj.weight", {V_, D_}, proj);
    g_b_ = ck.get(p + "g_b_proj.weight", {HV, V_}, proj);
    o_norm_ = ck.get(p + "o_norm.weight", {V_}, Init::ones());
    wo_ = ck.get(p + "o_proj.weight", {D_, HV}, proj);
  }

  std::unique_ptr<MixerState> make_state() const override {
    auto st = std::make_unique<LaState>();
    st->S = Tensor({H_, K_, V_});
    st->conv = {Tensor({W_ - 1, H_ * K_}), Tensor({W_ - 1, H_ * K_}), Tensor({W_ - 1, H_ * V_})};
    return st;
  }

  void forward(const float* x, int64_t T, MixerState& base, float* out) const override {
    auto* st = dynamic_cast<LaState*>(&base);
    DZ_CHECK(st && st->conv.size() == 3, "KDA mixer: state of another mixer kind");
    const int64_t HK = H_ * K_, HV = H_ * V_;
    std::vector<float> pre(size_t(T * std::max(HK, HV))), q(size_t(T * HK)), k(size_t(T * HK)), v(size_t(T * HV));
    // q, k, v: projection -> causal short conv + SiLU (state = conv tail) -> (q, k) L2 norm per head
    linear(x, wq_.ptr(), nullptr, pre.data(), T, D_, HK);
    short_conv_silu(pre.data(), cq_.ptr(), nullptr, T, HK, W_, st->conv[0].ptr(), q.data());
    linear(x, wk_.ptr(), nullptr, pre.data(), T, D_, HK);
    short_conv_silu(pre.data(), ck_.ptr(), nullptr, T, HK, W_, st->conv[1].ptr(), k.data());
    linear(x, wv_.ptr(), nullptr, pre.data(), T, D_, HV);
    short_conv_silu(pre.data(), cv_.ptr(), nullptr, T, HV, W_, st->conv[2].ptr(), v.data());
    l2norm(q.data(), q.data(), T * H_, K_, 1e-6f);
    l2norm(k.data(), k.data(), T * H_, K_, 1e-6f);

    // per-channel log-decay from the low-rank gate projection
    std::vector<float> low(size_t(T * std::max(K_, V_))), f(size_t(T * HK)), g(size_t(T * HK));
    linear(x, f_a_.ptr(), nullptr, low.data(), T, D_, K_);
    linear(low.data(), f_b_.ptr(), nullptr, f.data(), T, K_, HK);
    if (gate_ == KdaGate::Softplus)
      kda_gate_softplus(f.data(), A_log_.ptr(), dt_bias_.ptr(), T, H_, K_, g.data());
    else
      kda_gate_lower_bound(f.data(), A_log_.ptr(), dt_bias_.ptr(), lower_bound_, T, H_, K_, g.data());
    std::vector<float> beta(size_t(T * H_));
    linear(x, b_.ptr(), nullptr, beta.data(), T, D_, H_);
    for (auto& b : beta) b = sigmoid(b);

    std::vector<float> o(size_t(T * HV));
    const float scale = 1.f / std::sqrt(float(K_));
    if (T >= kLaChunk)
      kda_chunked(q.data(), k.data(), v.data(), g.data(), beta.data(), T, H_, H_, K_, V_, scale, st->S.ptr(), o.data());
    else
      kda_recurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), T, H_, H_, K_, V_, scale, st->S.ptr(),
                    o.data());

    // output gate (low rank) -> per-head RMSNorm * sigmoid(gate) -> o_proj
    std::vector<float> og(size_t(T * HV));
    linear(x, g_a_.ptr(), nullptr, low.data(), T, D_, V_);
    linear(low.data(), g_b_.ptr(), nullptr, og.data(), T, V_, HV);
    gated_rmsnorm(o.data(), og.data(), o_norm_.ptr(), o.data(), T * H_, V_, eps_, GateAct::Sigmoid);
    linear(o.data(), wo_.ptr(), nullptr, out, T, HV, D_);
    st->pos += T;
  }

 private:
  int64_t H_, K_, V_, D_, W_;
  float eps_, lower_bound_;
  KdaGate gate_;
  Tensor wq_, wk_, wv_;       // [H*K, D], [H*K, D], [H*V, D]
  Tensor cq_, ck_, cv_;       // [C, W]
  Tensor A_log_, dt_bias_;    // [H], [H*K]
  Tensor f_a_, f_b_, b_;      // [K, D], [H*K, K], [H, D]
  Tensor g_a_, g_b_, o_norm_; // [V, D], [H*V, V], [V]
  Tensor wo_;                 // [D, H*V]
};

}  // namespace

std::unique_ptr<Mixer> make_kda_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp) {
  DZ_CHECK(tp.size == 1, "layer ", layer, ": tensor parallelism is not implemented for this mixer yet");
  (void)layer;
  DZ_CHECK(cfg.family == Family::KimiLinear || cfg.family == Family::Dayzero, "KDA layer ", prefix,
           ": no KDA tensor names for model_type '", cfg.model_type, "'");
  return std::make_unique<KdaMixer>(cfg, ck, prefix);
}

}  // namespace dz
