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
  KdaMixer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, const TpShard& tp) {
    const int64_t Hf = cfg.la_num_k_heads;  // heads of the whole layer
    K_ = cfg.la_head_k_dim;
    V_ = cfg.la_head_v_dim;
    D_ = cfg.hidden_size;
    W_ = cfg.la_conv_kernel;
    eps_ = cfg.rms_norm_eps;
    gate_ = cfg.kda_gate;
    lower_bound_ = cfg.kda_gate_lower_bound;
    DZ_CHECK(Hf > 0 && K_ > 0 && V_ > 0 && D_ > 0 && W_ > 0, "KDA layer ", prefix, ": bad linear-attention sizes");
    DZ_CHECK(cfg.la_num_v_heads == Hf, "KDA layer ", prefix, ": value heads ", cfg.la_num_v_heads,
             " != key heads ", Hf, " (kimi_linear has one head count)");
    const std::string what = "KDA layer " + prefix + ": heads (la_num_k_heads)";
    const auto range = tp.range(Hf, what.c_str());
    // Generating mode (make-model) must see the full tensors: keep them all and reduce nothing.
    const bool shard = tp.size > 1 && !ck.generating();
    h0_ = shard ? range.first : 0;
    H_ = shard ? range.second - range.first : Hf;
    if (shard) tp_ = tp;
    const int64_t h0 = h0_, h1 = h0_ + H_;
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
    o_norm_ = ck.get(p + "o_norm.weight", {V_}, Init::ones());
    wo_ = ck.get(p + "o_proj.weight", {D_, HVf}, proj);
    if (shard) wo_ = slice_cols(wo_, h0 * V_, h1 * V_);
  }

  std::unique_ptr<MixerState> make_state() const override {
    auto st = std::make_unique<LaState>();
    st->S = Tensor({H_, K_, V_});
    st->conv = {Tensor({W_ - 1, conv_dim()})};
    return st;
  }

  void forward(const float* x, int64_t T, MixerState& base, float* out) const override {
    LaState& st = state_of(base);
    Tok tk = project(x, T);
    std::vector<float> c(size_t(T * conv_dim()));
    short_conv_silu(tk.pre.data(), conv_.ptr(), nullptr, T, conv_dim(), W_, st.conv[0].ptr(), c.data());
    Qkv a = split(c.data(), T);
    std::vector<float> o(size_t(T * H_ * V_));
    const float scale = 1.f / std::sqrt(float(K_));
    if (T >= kLaChunk)
      kda_chunked(a.q.data(), a.k.data(), a.v.data(), tk.g.data(), tk.beta.data(), T, H_, H_, K_, V_, scale,
                  st.S.ptr(), o.data());
    else
      kda_recurrent(a.q.data(), a.k.data(), a.v.data(), tk.g.data(), tk.beta.data(), T, H_, H_, K_, V_, scale,
                    st.S.ptr(), o.data());
    finish(o.data(), tk.og.data(), T, out);
    st.pos += T;
  }

  void forward_cp(const float* x, const CpCtx& ctx, MixerState& base, float* out) const override {
    LaState& st = state_of(base);
    DZ_CHECK(ctx.cp && ctx.lay, "KDA forward_cp: CpCtx needs a CP communicator and a layout");
    DZ_CHECK(st.pos == 0, "KDA forward_cp: the state has already consumed ", st.pos, " tokens (needs a fresh one)");
    const int64_t R = ctx.lay->local_rows();
    Tok tk;
    Qkv a;
    {
      auto timer = ctx.time("la_stage1");  // projections and the conv halo belong to stage 1
      tk = project(x, R);
      std::vector<float> c(size_t(R * conv_dim()));
      short_conv_silu_cp(tk.pre.data(), conv_.ptr(), nullptr, conv_dim(), W_, *ctx.lay, *ctx.cp, st.conv[0].ptr(),
                         c.data());
      a = split(c.data(), R);
    }
    std::vector<float> o(size_t(R * H_ * V_));
    kda_segmented(a.q.data(), a.k.data(), a.v.data(), tk.g.data(), tk.beta.data(), H_, H_, K_, V_,
                  1.f / std::sqrt(float(K_)), ctx, o.data(), st.S.ptr());
    {
      auto timer = ctx.time("la_stage2");
      finish(o.data(), tk.og.data(), R, out);
    }
    st.pos = ctx.lay->length;
  }

 private:
  // Per-token inputs of the scan: pre [T, conv_dim] the pre-conv q|k|v, g [T, H, K] log-decay,
  // beta [T, H], og [T, H*V] the output gate before its sigmoid.
  struct Tok {
    std::vector<float> pre, g, beta, og;
  };
  struct Qkv {
    std::vector<float> q, k, v;  // [T, H, K], [T, H, K], [T, H, V]
  };

  int64_t conv_dim() const { return H_ * (2 * K_ + V_); }

  static LaState& state_of(MixerState& base) {
    auto* st = dynamic_cast<LaState*>(&base);
    DZ_CHECK(st && st->conv.size() == 1, "KDA mixer: state of another mixer kind");
    return *st;
  }

  Tok project(const float* x, int64_t T) const {
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
    tk.og.resize(size_t(T * HV));
    linear(x, g_a_.ptr(), nullptr, low.data(), T, D_, V_);
    linear(low.data(), g_b_.ptr(), nullptr, tk.og.data(), T, V_, HV);
    return tk;
  }

  // conv output c [T, conv_dim] -> q, k (L2-normalised per head), v
  Qkv split(const float* c, int64_t T) const {
    const int64_t HK = H_ * K_, HV = H_ * V_, CD = conv_dim();
    Qkv a;
    a.q.resize(size_t(T * HK));
    a.k.resize(size_t(T * HK));
    a.v.resize(size_t(T * HV));
    for (int64_t t = 0; t < T; ++t) {
      const float* r = c + t * CD;
      std::copy(r, r + HK, a.q.begin() + t * HK);
      std::copy(r + HK, r + 2 * HK, a.k.begin() + t * HK);
      std::copy(r + 2 * HK, r + CD, a.v.begin() + t * HV);
    }
    l2norm(a.q.data(), a.q.data(), T * H_, K_, 1e-6f);
    l2norm(a.k.data(), a.k.data(), T * H_, K_, 1e-6f);
    return a;
  }

  // o [T, H*V] -> per-head RMSNorm * sigmoid(gate) -> o_proj (partial under TP) -> all-reduce
  void finish(float* o, const float* og, int64_t T, float* out) const {
    gated_rmsnorm(o, og, o_norm_.ptr(), o, T * H_, V_, eps_, GateAct::Sigmoid);
    linear(o, wo_.ptr(), nullptr, out, T, H_ * V_, D_);
    tp_.allreduce_sum(out, T * D_);
  }

  int64_t H_, h0_, K_, V_, D_, W_;  // H_: heads on this TP rank, from global head h0_
  float eps_, lower_bound_;
  KdaGate gate_;
  TpShard tp_;                // size 1 unless the weights are a shard
  Tensor wq_, wk_, wv_;       // [H*K, D], [H*K, D], [H*V, D]
  Tensor conv_;               // [H*K + H*K + H*V, W]: q, k, v conv weights stacked
  Tensor A_log_, dt_bias_;    // [H], [H*K]
  Tensor f_a_, f_b_, b_;      // [K, D] (replicated), [H*K, K], [H, D]
  Tensor g_a_, g_b_, o_norm_; // [V, D] (replicated), [H*V, V], [V]
  Tensor wo_;                 // [D, H*V]: this rank's columns
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
