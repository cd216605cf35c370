#include "model/la_mixer.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/linalg.hpp"
#include "ops/norm.hpp"
#include "ops/linear_attn.hpp"
#include "ops/short_conv.hpp"

namespace dz {

std::unique_ptr<MixerState> LaState::clone() const {
  auto c = std::make_unique<LaState>();
  c->pos = pos;
  c->be = be;
  c->S = be->alloc(S.shape, S.dtype);
  be->copy_rows(S.reshaped({1, S.numel()}), 0, c->S.reshaped({1, S.numel()}), 0, 1);
  c->conv = be->alloc(conv.shape, conv.dtype);
  if (conv.numel()) be->copy_rows(conv, 0, c->conv, 0, conv.rows());
  return c;
}

std::unique_ptr<MixerState> LinearAttnMixer::make_state() const {
  auto st = std::make_unique<LaState>();
  st->be = be_;
  st->S = be_->zeros({HV_, K_, V_}, DType::F32);
  st->conv = be_->zeros({W_ - 1, conv_dim()}, be_->act_dtype());
  return st;
}

LaState& LinearAttnMixer::state_of(MixerState& base) const {
  auto* st = dynamic_cast<LaState*>(&base);
  DZ_CHECK(st && st->be == be_ && st->conv.cols() == conv_dim(), name_, " mixer: state of another mixer kind");
  return *st;
}

// o [T, HV*V] -> per-head RMSNorm * act(gate) -> output projection (partial under TP) -> all-reduce
void LinearAttnMixer::finish(DTensor& o, const DTensor& gate, DTensor& out) const {
  DTensor oh = o.reshaped({o.numel() / V_, V_});
  be_->gated_rmsnorm(oh, gate, out_norm_, oh, eps_, act_);
  be_->linear(o, wo_, DTensor{}, out);
  be_->allreduce_sum(tp_.size > 1 ? tp_.comm : nullptr, out);
}

void LinearAttnMixer::forward(const DTensor& x, MixerState& base, DTensor& out) const {
  LaState& st = state_of(base);
  const int64_t T = x.rows(), KD = HK_ * K_, VD = HV_ * V_;
  Tok tk = project(x);
  DTensor c = be_->act({T, conv_dim()});
  be_->short_conv(tk.pre, conv_, st.conv, c);
  LaScanArgs a;
  a.kda = per_channel_;
  a.HK = HK_, a.HV = HV_, a.K = K_, a.V = V_;
  a.scale = 1.f / std::sqrt(float(K_));
  a.q = be_->act({T, KD});
  a.k = be_->act({T, KD});
  a.v = be_->act({T, VD});
  be_->copy_cols(c, 0, a.q, 0, KD);
  be_->copy_cols(c, KD, a.k, 0, KD);
  be_->copy_cols(c, 2 * KD, a.v, 0, VD);
  a.beta = tk.beta;
  a.gate = LaGateArgs{tk.f, A_log_, dt_bias_, lower_bound_};
  a.state = st.S;
  a.o = be_->act({T, VD});
  be_->la_scan(a);
  finish(a.o, tk.gate, out);
  st.pos += T;
}

void LinearAttnMixer::forward_cp(const DTensor& x, const CpCtx& ctx, MixerState& base, DTensor& out) const {
  LaState& st = state_of(base);
  DZ_CHECK(ctx.cp && ctx.lay, name_, " forward_cp: CpCtx needs a CP communicator and a layout");
  DZ_CHECK(st.pos == 0, name_, " forward_cp: the state has already consumed ", st.pos, " tokens (needs a fresh one)");
  DZ_CHECK(be_->device() == Device::Host, name_, " forward_cp: context parallelism runs on the cpu backend only in ",
           "this version (the CUDA two-stage scan is not wired yet); use --cp 1 with --backend ", be_->name());
  const int64_t R = ctx.lay->local_rows(), KD = HK_ * K_, VD = HV_ * V_, CD = conv_dim();
  Tok tk;
  std::vector<float> q(size_t(R * KD)), k(size_t(R * KD)), v(size_t(R * VD)), beta(size_t(R * HV_));
  std::vector<float> g(size_t(R * HV_ * (per_channel_ ? K_ : 1)));
  {
    auto timer = ctx.time("la_stage1");  // projections and the conv halo belong to stage 1
    tk = project(x);
    std::vector<float> c(size_t(R * CD));
    short_conv_silu_cp(tk.pre.f32(), conv_.f32(), nullptr, CD, W_, *ctx.lay, *ctx.cp, st.conv.f32(), c.data());
    for (int64_t t = 0; t < R; ++t) {
      const float* row = c.data() + t * CD;
      std::copy(row, row + KD, q.begin() + t * KD);
      std::copy(row + KD, row + 2 * KD, k.begin() + t * KD);
      std::copy(row + 2 * KD, row + CD, v.begin() + t * VD);
    }
    l2norm(q.data(), q.data(), R * HK_, K_, 1e-6f);
    l2norm(k.data(), k.data(), R * HK_, K_, 1e-6f);
    for (int64_t i = 0; i < R * HV_; ++i) beta[size_t(i)] = sigmoid(tk.beta.f32()[i]);
    const int64_t GK = per_channel_ ? K_ : 1;
    const float* dtb = dt_bias_.defined() ? dt_bias_.f32() : nullptr;
    if (lower_bound_ == 0.f)
      kda_gate_softplus(tk.f.f32(), A_log_.f32(), dtb, R, HV_, GK, g.data());
    else
      kda_gate_lower_bound(tk.f.f32(), A_log_.f32(), dtb, lower_bound_, R, HV_, GK, g.data());
  }
  DTensor o = be_->act({R, VD});
  (per_channel_ ? kda_segmented : gdn_segmented)(q.data(), k.data(), v.data(), g.data(), beta.data(), HK_, HV_, K_, V_,
                                                  1.f / std::sqrt(float(K_)), ctx, o.f32(), st.S.f32());
  {
    auto timer = ctx.time("la_stage2");
    finish(o, tk.gate, out);
  }
  st.pos = ctx.lay->length;
}

}  // namespace dz
