#include "model/la_mixer.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/linalg.hpp"
#include "ops/linear_attn.hpp"
#include "ops/short_conv.hpp"

namespace dz {

std::unique_ptr<MixerState> LinearAttnMixer::make_state() const {
  auto st = std::make_unique<LaState>();
  st->S = Tensor({HV_, K_, V_});
  st->conv = {Tensor({W_ - 1, conv_dim()})};
  return st;
}

LaState& LinearAttnMixer::state_of(MixerState& base) const {
  auto* st = dynamic_cast<LaState*>(&base);
  DZ_CHECK(st && st->conv.size() == 1, name_, " mixer: state of another mixer kind");
  return *st;
}

// conv output c [T, conv_dim] -> q, k (L2-normalised per head), v
LinearAttnMixer::Qkv LinearAttnMixer::split(const float* c, int64_t T) const {
  const int64_t KD = HK_ * K_, VD = HV_ * V_, CD = conv_dim();
  Qkv a;
  a.q.resize(size_t(T * KD));
  a.k.resize(size_t(T * KD));
  a.v.resize(size_t(T * VD));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = c + t * CD;
    std::copy(row, row + KD, a.q.begin() + t * KD);
    std::copy(row + KD, row + 2 * KD, a.k.begin() + t * KD);
    std::copy(row + 2 * KD, row + CD, a.v.begin() + t * VD);
  }
  l2norm(a.q.data(), a.q.data(), T * HK_, K_, 1e-6f);
  l2norm(a.k.data(), a.k.data(), T * HK_, K_, 1e-6f);
  return a;
}

// o [T, HV*V] -> per-head RMSNorm * act(gate) -> output projection (partial under TP) -> all-reduce
void LinearAttnMixer::finish(float* o, const float* gate, int64_t T, float* out) const {
  gated_rmsnorm(o, gate, out_norm_.ptr(), o, T * HV_, V_, eps_, act_);
  linear(o, wo_.ptr(), nullptr, out, T, HV_ * V_, D_);
  tp_.allreduce_sum(out, T * D_);
}

void LinearAttnMixer::forward(const float* x, int64_t T, MixerState& base, float* out) const {
  LaState& st = state_of(base);
  Tok tk = project(x, T);
  std::vector<float> c(size_t(T * conv_dim()));
  short_conv_silu(tk.pre.data(), conv_.ptr(), nullptr, T, conv_dim(), W_, st.conv[0].ptr(), c.data());
  Qkv a = split(c.data(), T);
  std::vector<float> o(size_t(T * HV_ * V_));
  const float scale = 1.f / std::sqrt(float(K_));
  const float *q = a.q.data(), *k = a.k.data(), *v = a.v.data(), *g = tk.g.data(), *b = tk.beta.data();
  if (T >= kLaChunk)
    (per_channel_ ? kda_chunked : gdn_chunked)(q, k, v, g, b, T, HK_, HV_, K_, V_, scale, st.S.ptr(), o.data(), kLaChunk);
  else
    (per_channel_ ? kda_recurrent : gdn_recurrent)(q, k, v, g, b, T, HK_, HV_, K_, V_, scale, st.S.ptr(), o.data());
  finish(o.data(), tk.gate.data(), T, out);
  st.pos += T;
}

void LinearAttnMixer::forward_cp(const float* x, const CpCtx& ctx, MixerState& base, float* out) const {
  LaState& st = state_of(base);
  DZ_CHECK(ctx.cp && ctx.lay, name_, " forward_cp: CpCtx needs a CP communicator and a layout");
  DZ_CHECK(st.pos == 0, name_, " forward_cp: the state has already consumed ", st.pos, " tokens (needs a fresh one)");
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
  std::vector<float> o(size_t(R * HV_ * V_));
  (per_channel_ ? kda_segmented : gdn_segmented)(a.q.data(), a.k.data(), a.v.data(), tk.g.data(), tk.beta.data(), HK_,
                                                  HV_, K_, V_, 1.f / std::sqrt(float(K_)), ctx, o.data(), st.S.ptr());
  {
    auto timer = ctx.time("la_stage2");
    finish(o.data(), tk.gate.data(), R, out);
  }
  st.pos = ctx.lay->length;
}

}  // namespace dz
