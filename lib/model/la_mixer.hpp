// The shared skeleton of the delta-rule linear-attention mixers (KDA, Gated DeltaNet): a family's
// projections give the pre-conv [q | k | v], the log-decay, beta and the output gate; then one
// short conv + SiLU over [q | k | v], L2-normalised q and k, the scan (recurrent / chunked, or the
// two-stage segmented scan under CP), a gated RMSNorm per head and the output projection
// (partial under TP, all-reduced). Families differ only in their projections and weights.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.hpp"
#include "model/module.hpp"
#include "ops/linear_attn.hpp"  // LaState
#include "ops/norm.hpp"

namespace dz {

class LinearAttnMixer : public Mixer {
 public:
  std::unique_ptr<MixerState> make_state() const override;
  void forward(const float* x, int64_t T, MixerState& state, float* out) const override;
  void forward_cp(const float* x, const CpCtx& ctx, MixerState& state, float* out) const override;

 protected:
  // Per-token inputs of the scan: pre [T, conv_dim] the pre-conv q|k|v (all q heads, all k heads,
  // all v heads), g [T, HV, per_channel ? K : 1] log-decay, beta [T, HV], gate [T, HV*V] the output
  // gate before its activation.
  struct Tok {
    std::vector<float> pre, g, beta, gate;
  };
  virtual Tok project(const float* x, int64_t T) const = 0;

  int64_t conv_dim() const { return 2 * HK_ * K_ + HV_ * V_; }

  const char* name_ = "";  // for messages: "KDA" / "GDN"
  bool per_channel_ = false;  // KDA's per-channel decay (else one scalar per value head)
  GateAct act_ = GateAct::SiLU;  // output gate activation
  int64_t HK_ = 0, HV_ = 0, K_ = 0, V_ = 0, D_ = 0, W_ = 0;  // HK_, HV_: heads on this TP rank
  float eps_ = 1e-6f;
  TpShard tp_;        // size 1 unless the weights are a shard
  Tensor conv_;       // [conv_dim, W]
  Tensor out_norm_;   // [V]
  Tensor wo_;         // [D, HV*V]: this rank's columns

 private:
  struct Qkv {
    std::vector<float> q, k, v;  // [T, HK, K], [T, HK, K], [T, HV, V]
  };
  LaState& state_of(MixerState& base) const;
  Qkv split(const float* c, int64_t T) const;
  void finish(float* o, const float* gate, int64_t T, float* out) const;
};

}  // namespace dz
