// KDA token mixer (Kimi Linear / K3 / dayzero): projections, short convs, gate, delta rule,
// gated output norm, output projection. Tensor names are the published kimi_linear ones
// (moonshotai/Kimi-Linear-48B-A3B: PREFIX self_attn.{q,k,v}_proj, {q,k,v}_conv1d, A_log, dt_bias,
// f_a_proj, f_b_proj, b_proj, g_a_proj, g_b_proj, o_norm, o_proj); the dayzero family uses the same.
// Kimi K3 (linear_attn_config.use_full_rank_gate): the output gate is one full-rank g_proj [H·V, D]
// instead of g_a_proj · g_b_proj, and A_log is stored zero-padded to a multiple of 128 heads.
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

// A_log [H] in any of its published layouts: [1, 1, H, 1] (transformers), [H, 1], [H], or Kimi K3's
// [ceil(H / 128) * 128] whose entries past H are zero padding (checked: a non-zero one would be a
// head this config does not have).
Tensor load_a_log(Checkpoint& ck, const std::string& name, int64_t H) {
  const Init init = Init::uniform(0.f, std::log(16.f));  // exp(A_log) in [1, 16], Kimi's init
  const int64_t Hp = (H + 127) / 128 * 128;
  if (!ck.generating() && ck.has(name) && Hp != H && ck.info(name).shape == Shape{Hp}) {
    Tensor t = ck.get(name, {Hp}, init);
    if (t.empty()) {  // dry run: the shape of the heads
      t.shape = {H};
      return t;
    }
    for (int64_t h = H; h < Hp; ++h)
      DZ_CHECK(t.ptr()[h] == 0.f, "tensor ", ck.file_name(name), ": entry ", h, " of the padding past the ", H,
               " heads is ", t.ptr()[h], ", not 0");
    Tensor o({H});
    std::copy_n(t.ptr(), H, o.ptr());
    return o;
  }
  return get_alt(ck, name, {{1, 1, H, 1}, {H, 1}, {H}}, init);
}

// Rows of several [n_i, D] host tensors stacked into one [sum n_i, D]: one GEMM instead of several
// (each output row is the same dot product, so results are unchanged).
Tensor stack_rows(const std::vector<const Tensor*>& parts) {
  int64_t n = 0;
  for (const Tensor* t : parts) n += t->shape[0];
  Shape s = parts[0]->shape;
  s[0] = n;
  Tensor o(s);
  auto dst = o.data.begin();
  for (const Tensor* t : parts) dst = std::copy(t->data.begin(), t->data.end(), dst);
  return o;
}

class KdaMixer : public LinearAttnMixer {
 public:
  KdaMixer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, const TpShard& tp, Backend& be) {
    be_ = &be;
    const int64_t Hf = cfg.la_num_k_heads;  // heads of the whole layer
    K_ = cfg.la_head_k_dim;
    V_ = cfg.la_head_v_dim;
    D_ = cfg.hidden_size;
    W_ = cfg.la_conv_kernel;
    eps_ = cfg.rms_norm_eps;
    name_ = "KDA";
    per_channel_ = true;
    act_ = GateAct::Sigmoid;
    lower_bound_ = cfg.kda_gate == KdaGate::Softplus ? 0.f : cfg.kda_gate_lower_bound;
    DZ_CHECK(cfg.kda_gate == KdaGate::Softplus || lower_bound_ < 0.f, "KDA layer ", prefix,
             ": the lower-bound gate needs lower_bound < 0, got ", lower_bound_);
    DZ_CHECK(Hf > 0 && K_ > 0 && V_ > 0 && D_ > 0 && W_ > 0, "KDA layer ", prefix, ": bad linear-attention sizes");
    DZ_CHECK(cfg.la_num_v_heads == Hf, "KDA layer ", prefix, ": value heads ", cfg.la_num_v_heads,
             " != key heads ", Hf, " (kimi_linear has one head count)");
    const std::string what = "KDA layer " + prefix + ": heads (la_num_k_heads)";
    const auto range = tp.range(Hf, what.c_str());
    // Generating mode (make-model) must see the full tensors: keep them all and reduce nothing.
    const bool shard = tp.size > 1 && !ck.keeps_full();
    const int64_t h0 = shard ? range.first : 0, h1 = shard ? range.second : Hf;
    H_ = HK_ = HV_ = h1 - h0;
    if (shard) tp_ = tp;
    auto rows = [&](Tensor t, int64_t per_head) { return shard ? slice_rows(t, h0 * per_head, h1 * per_head) : t; };

    const std::string p = prefix + "self_attn.";
    const int64_t HKf = Hf * K_, HVf = Hf * V_;
    const Init proj = Init::normal(0.02f);
    const float cb = 1.f / std::sqrt(float(W_));  // torch Conv1d default init bound
    const Tensor wq = rows(ck.get(p + "q_proj.weight", {HKf, D_}, proj), K_);
    const Tensor wk = rows(ck.get(p + "k_proj.weight", {HKf, D_}, proj), K_);
    const Tensor wv = rows(ck.get(p + "v_proj.weight", {HVf, D_}, proj), V_);
    const Tensor cq = rows(get_alt(ck, p + "q_conv1d.weight", {{HKf, 1, W_}, {HKf, W_}}, Init::uniform(-cb, cb)), K_);
    const Tensor ckw = rows(get_alt(ck, p + "k_conv1d.weight", {{HKf, 1, W_}, {HKf, W_}}, Init::uniform(-cb, cb)), K_);
    const Tensor cv = rows(get_alt(ck, p + "v_conv1d.weight", {{HVf, 1, W_}, {HVf, W_}}, Init::uniform(-cb, cb)), V_);
    // A_log: exp(A_log) in [1, 16] as Kimi's init; dt_bias around inverse-softplus of small dt.
    const Tensor A_log = rows(load_a_log(ck, p + "A_log", Hf), 1);
    const Tensor dt_bias = rows(get_alt(ck, p + "dt_bias", {{HKf}, {Hf, K_}, {HKf}}, Init::uniform(-4.f, -1.f)), K_);
    const Tensor f_a = ck.get(p + "f_a_proj.weight", {K_, D_}, proj);
    const Tensor f_b = rows(ck.get(p + "f_b_proj.weight", {HKf, K_}, proj), K_);
    const Tensor b = rows(ck.get(p + "b_proj.weight", {Hf, D_}, proj), 1);
    Tensor g_a, g_b, g_full;  // output gate: low rank (Kimi Linear) or full rank (K3)
    if (cfg.kda_full_rank_gate) {
      g_full = rows(ck.get(p + "g_proj.weight", {HVf, D_}, proj), V_);
    } else {
      g_a = ck.get(p + "g_a_proj.weight", {V_, D_}, proj);
      g_b = rows(ck.get(p + "g_b_proj.weight", {HVf, V_}, proj), V_);
    }
    const Tensor o_norm = ck.get(p + "o_norm.weight", {V_}, Init::ones());
    Tensor wo = ck.get(p + "o_proj.weight", {D_, HVf}, proj);
    if (shard) wo = slice_cols(wo, h0 * V_, h1 * V_);
    if (wq.empty()) return;  // dry run (inspect): names and shapes only, nothing to upload

    wqkv_ = be.weight(stack_rows({&wq, &wk, &wv}));   // [q | k | v] channels, as the conv sees them
    conv_ = be.weight(stack_rows({&cq, &ckw, &cv}));  // one depthwise conv over [q | k | v]
    A_log_ = be.param(A_log);
    dt_bias_ = be.param(dt_bias);
    f_a_ = be.weight(f_a);
    f_b_ = be.weight(f_b);
    b_ = be.weight(b);
    if (cfg.kda_full_rank_gate) {
      g_full_ = be.weight(g_full);
    } else {
      g_a_ = be.weight(g_a);
      g_b_ = be.weight(g_b);
    }
    out_norm_ = be.param(o_norm);
    wo_ = be.weight(wo);
  }

 private:
  Tok project(const DTensor& x) const override {
    const int64_t T = x.rows();
    Backend& be = *be_;
    Tok tk;
    tk.pre = be.act({T, conv_dim()});
    be.linear(x, wqkv_, DTensor{}, tk.pre);
    DTensor low = be.act({T, K_});  // per-channel log-decay input from the low-rank gate projection
    be.linear(x, f_a_, DTensor{}, low);
    tk.f = be.act({T, H_ * K_});
    be.linear(low, f_b_, DTensor{}, tk.f);
    tk.beta = be.act({T, H_});
    be.linear(x, b_, DTensor{}, tk.beta);
    tk.gate = be.act({T, H_ * V_});
    if (g_full_.defined()) {  // output gate (full rank)
      be.linear(x, g_full_, DTensor{}, tk.gate);
    } else {  // output gate (low rank)
      DTensor lowg = be.act({T, V_});
      be.linear(x, g_a_, DTensor{}, lowg);
      be.linear(lowg, g_b_, DTensor{}, tk.gate);
    }
    return tk;
  }

  int64_t H_ = 0;             // heads on this TP rank (KDA has one head count: HK_ = HV_ = H_)
  DTensor wqkv_;              // [H*K + H*K + H*V, D]: q_proj, k_proj, v_proj stacked
  DTensor f_a_, f_b_, b_;     // [K, D] (replicated), [H*K, K], [H, D]
  DTensor g_a_, g_b_;         // [V, D] (replicated), [H*V, V]; out_norm_ o_norm [V]
  DTensor g_full_;            // [H*V, D]: K3's full-rank output gate (then no g_a_ / g_b_)
};

}  // namespace

std::unique_ptr<Mixer> make_kda_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp, Backend& be) {
  (void)layer;
  DZ_CHECK(cfg.family == Family::KimiLinear || cfg.family == Family::Dayzero || cfg.family == Family::Glm5Next,
           "KDA layer ", prefix,
           ": no KDA tensor names for model_type '", cfg.model_type, "'");
  return std::make_unique<KdaMixer>(cfg, ck, prefix, tp, be);
}

}  // namespace dz
