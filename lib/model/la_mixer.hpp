// The shared skeleton of the delta-rule linear-attention mixers (KDA, Gated DeltaNet): a family's
// projections give the pre-conv [q | k | v], the raw gate input, the beta logits and the output
// gate; then one short conv + SiLU over [q | k | v], the scan (the backend's la_scan: L2-normalised
// q and k, sigmoid beta, the gate, recurrent / chunked; or the two-stage segmented scan under CP),
// a gated RMSNorm per head and the output projection (partial under TP, all-reduced). Families
// differ only in their projections and weights. Written once on the backend seam.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.hpp"
#include "model/module.hpp"
#include "ops/linear_attn.hpp"
#include "ops/norm.hpp"
#include "model/la_state.hpp"

namespace dz {

class LinearAttnMixer : public Mixer {
 public:
  std::unique_ptr<MixerState> make_state() const override;
  void forward(const DTensor& x, MixerState& state, const DTensor& out) const override;
  void forward_cp(const DTensor& x, const CpCtx& ctx, MixerState& state, const DTensor& out) const override;
  // Projections, output norm and projection over all packed rows at once. One token per document
  // (a decode step): the conv and the recurrent kernel over the documents' pool slots in place;
  // else the conv per document and one varlen scan (states gathered into [N, HV, K, V] and back).
  void forward_packed(const DTensor& x, const std::vector<int64_t>& cu, const std::vector<MixerState*>& st,
                      const DTensor& out) const override;
  int64_t hidden() const override { return D_; }
  // A decode step is the recurrent kernel on the states in place and the conv on its tail.
  bool graph_safe_decode() const override { return tp_.size == 1; }
  // Speculative decoding: Replay snapshots the state and conv tail, the verify forward records its
  // rows' pre-conv projections, gate inputs and beta logits, and spec_keep restores the snapshot
  // and runs the conv and the scan again over the kept rows (no projection again). PerToken: the
  // verify forward scans row by row keeping every row's state (Backend::la_scan_states); spec_keep
  // takes the kept row's and rebuilds the conv tail from the old tail and the kept inputs.
  void spec_begin(MixerState& st, SpecRestore how, Copies* copies) const override;
  void spec_keep(MixerState& st, int64_t keep, Copies* copies) const override;
  using Mixer::forward;
  using Mixer::forward_cp;

 protected:
  // Per-token inputs of the scan (act dtype): pre [T, conv_dim] the pre-conv q|k|v (all q heads,
  // all k heads, all v heads), f [T, HV*K] (KDA) / [T, HV] (GDN) the raw gate input, beta [T, HV]
  // logits, gate [T, HV*V] the output gate before its activation.
  struct Tok {
    DTensor pre, f, beta, gate;
  };
  virtual Tok project(const DTensor& x) const = 0;

  int64_t conv_dim() const { return 2 * HK_ * K_ + HV_ * V_; }

  Backend* be_ = nullptr;
  const char* name_ = "";  // for messages: "KDA" / "GDN"
  bool per_channel_ = false;  // KDA's per-channel decay (else one scalar per value head)
  GateAct act_ = GateAct::SiLU;  // output gate activation
  int64_t HK_ = 0, HV_ = 0, K_ = 0, V_ = 0, D_ = 0, W_ = 0;  // HK_, HV_: heads on this TP rank
  float eps_ = 1e-6f;
  float lower_bound_ = 0.f;  // 0: softplus gate; < 0: KDA lower-bound sigmoid gate
  TpShard tp_;        // size 1 unless the weights are a shard
  DTensor conv_;      // [conv_dim, W]
  DTensor A_log_;     // [HV] F32
  DTensor dt_bias_;   // [HV*K] (KDA) / [HV] (GDN) F32
  DTensor out_norm_;  // [V] F32
  DTensor wo_;        // [D, HV*V]: this rank's columns
  // This layer's state pool (made with the first state; shared with the states it holds).
  mutable std::shared_ptr<LaPool> pool_;

 private:
  LaState& state_of(MixerState& base) const;
  // la_scan of one sequence on st's state, or la_scan_states into its record when a per-token
  // verify forward (spec_begin) is under way.
  void scan(LaState& st, const LaScanArgs& a) const;
  // A verify forward's rows r0 .. r1 of tk are this state's (spec_begin set its record).
  void note_spec(LaState& st, const Tok& tk, int64_t r0, int64_t r1) const;
  void finish(DTensor& o, const DTensor& gate, const DTensor& out) const;
  // The scan's inputs for T rows: q | k | v allocated (the conv writes them), beta and gate from tk.
  LaScanArgs scan_args(const Tok& tk, int64_t T) const;
};

}  // namespace dz
