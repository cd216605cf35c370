// The interfaces every model part implements. A model is a list of layers; each layer has a token
// mixer (KDA, GDN, MLA/DSA, GQA) and an FFN (dense MLP or MoE). Mixers own their per-sequence
// state (recurrent state + conv tail, or KV cache + indexer keys), so prefill and decode are one
// code path: forward over T new tokens appends them to the state.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.hpp"
#include "config/model_config.hpp"
#include "core/dtensor.hpp"
#include "core/tensor.hpp"
#include "io/checkpoint.hpp"
#include "model/parallel.hpp"
#include "ops/mixer_state.hpp"

namespace dz {

class Mixer {
 public:
  virtual ~Mixer() = default;
  virtual std::unique_ptr<MixerState> make_state() const = 0;
  // x [T, D] (act dtype, on the mixer's backend): normed input for absolute positions
  // st.pos .. st.pos+T-1. out [T, D]: the mixer's output (after its output projection). Advances st by T.
  virtual void forward(const DTensor& x, MixerState& st, const DTensor& out) const = 0;
  // Context-parallel prefill of a whole document from position 0 (st must be fresh): x [R, D]
  // holds this rank's rows in ctx.lay order (local_positions()), out [R, D] the same rows. Equal
  // to forward() over the whole document within fp32 reassociation. On return st holds the state
  // after the whole document on every CP rank, so decode continues with forward().
  virtual void forward_cp(const DTensor& x, const CpCtx& ctx, MixerState& st, const DTensor& out) const = 0;
  // A packed forward (Model::forward_packed): x / out [cu.back(), D] hold the rows of cu.size() - 1
  // documents in order, st[b] the state of document b. Equal to forward() of each document; the
  // default is exactly that, a mixer may batch the row-wise work across documents.
  virtual void forward_packed(const DTensor& x, const std::vector<int64_t>& cu, const std::vector<MixerState*>& st,
                              const DTensor& out) const {
    for (size_t b = 0; b + 1 < cu.size(); ++b) forward(x.slab(cu[b], cu[b + 1]), *st[b], out.slab(cu[b], cu[b + 1]));
  }
  virtual int64_t hidden() const = 0;
  // True when a decode step of this mixer (forward_packed of one token per document on states
  // with history) may be captured in a CUDA graph and replayed (model/decode_runner.hpp): no
  // uploads, downloads or collectives through the host, no kernel argument that changes from step
  // to step, and no host-side effect but each state's pos += 1. Attention mixers are not (their
  // positions and cache lengths are kernel arguments).
  virtual bool graph_safe_decode() const { return false; }

  // Speculative decoding (DESIGN §11). spec_begin: the next forward (or forward_packed) over st is
  // a verify forward of T rows; the mixer notes what it needs to undo it (a mixer that cannot
  // throws, naming itself). spec_keep: after that forward, keep its first `keep` rows (1 <= keep
  // <= T) and undo the others, as if only the kept rows had been forwarded; st.pos ends at the
  // position before the verify forward plus keep. The default (attention caches) and DeepSeek-V4's
  // also take several forwards between the two, T rows in all: Model::mtp_draft's chained MTP rows.
  // copies: where a mixer puts its device copies that read nothing another copy writes and that
  // nothing reads before the caller makes them all at once (Backend::copy_rows_many: one launch
  // for every document and layer, Model::spec_begin / spec_keep); nullptr: made at once.
  using Copies = std::vector<Backend::RowCopy>;
  virtual void spec_begin(MixerState& st, SpecRestore how, Copies* copies) const;
  virtual void spec_keep(MixerState& st, int64_t keep, Copies* copies) const;

  // Host fp32 conveniences for mixers on the CPU backend (tools, tests).
  void forward(const float* x, int64_t T, MixerState& st, float* out) const {
    DTensor o = host_view(out, {T, hidden()});
    forward(host_view(const_cast<float*>(x), {T, hidden()}), st, o);
  }
  void forward_cp(const float* x, const CpCtx& ctx, MixerState& st, float* out) const {
    const int64_t R = ctx.lay ? ctx.lay->local_rows() : 0;
    DTensor o = host_view(out, {R, hidden()});
    forward_cp(host_view(const_cast<float*>(x), {R, hidden()}), ctx, st, o);
  }
};

class Ffn {
 public:
  virtual ~Ffn() = default;
  // x [T, D] -> out [T, D] (act dtype)
  virtual void forward(const DTensor& x, const DTensor& out) const = 0;
  virtual int64_t hidden() const = 0;
  // The same with the rows' token ids (host, [T]): DeepSeek-V4's hash-routed MoE picks its experts
  // by token id; every other FFN ignores them.
  virtual void forward_tokens(const DTensor& x, const int32_t* tokens, const DTensor& out) const {
    (void)tokens;
    forward(x, out);
  }
  // The same inside Model::forward_cp, where the CP ranks hold different rows of one document
  // (expert parallelism sends rows to the ranks holding their experts); otherwise forward_tokens.
  virtual void forward_cp_rows(const DTensor& x, const int32_t* tokens, const DTensor& out) const {
    forward_tokens(x, tokens, out);
  }
  virtual bool needs_tokens() const { return false; }
  // True when forward may be captured in a CUDA graph (no host round trip: no TP all-reduce
  // through MPI, no upload).
  virtual bool graph_safe() const { return false; }
  void forward(const float* x, int64_t T, float* out) const {
    DTensor o = host_view(out, {T, hidden()});
    forward(host_view(const_cast<float*>(x), {T, hidden()}), o);
  }
};

// Factories (one per module family, each in its own file). `prefix` is the layer's prefix, e.g.
// "model.layers.3.", and the factory picks the family's published tensor names from cfg.family.
// `tp` selects the tensor-parallel shard to load (default: everything, no communication); `be`
// is the backend the weights are uploaded to and the forward runs on.
std::unique_ptr<Mixer> make_kda_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp = TpShard{}, Backend& be = cpu_backend());
std::unique_ptr<Mixer> make_gdn_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp = TpShard{}, Backend& be = cpu_backend());
// DSA Top-K sets handed from a layer that runs its indexer to the GLM-5 "shared" layers after it
// (mla_mixer.cpp): both see the same rows in the same calls, so the readers take the writer's
// selections in the order it made them.
struct TopkShare;
struct TopkLink {
  std::shared_ptr<TopkShare> publish;  // this layer runs its indexer and hands its selections on
  std::shared_ptr<TopkShare> take;     // this layer has no indexer: it takes them (shared_indexer)
  int reader = 0;                      // which reader of `take` this layer is
};
std::shared_ptr<TopkShare> make_topk_share();
std::unique_ptr<Mixer> make_mla_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp = TpShard{}, Backend& be = cpu_backend());
// The same, in a stack where DSA Top-K sets pass between layers (GLM-5 shared indexers).
std::unique_ptr<Mixer> make_mla_mixer_linked(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                             const TpShard& tp, Backend& be, const TopkLink& topk);
std::unique_ptr<Mixer> make_gqa_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp = TpShard{}, Backend& be = cpu_backend());
// DeepSeek-V4's attention (sliding window + CSA / HCA compressed entries, sinks, grouped output).
std::unique_ptr<Mixer> make_dsv4_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                       const TpShard& tp = TpShard{}, Backend& be = cpu_backend());
// The gate activation of every MLP and expert of the model (swiglu_limit, SiTU); refuses the
// hidden_act values no gated MLP of dayzero computes (layer: for the message).
inline GluAct glu_of(const ModelConfig& cfg, int layer) {
  DZ_CHECK(cfg.hidden_act == "silu" || cfg.hidden_act == "swish" || (cfg.hidden_act == "situ" && cfg.situ_beta > 0.f),
           "layer ", layer, ": hidden_act '", cfg.hidden_act, "' is not supported (silu / SwiGLU, situ)");
  GluAct a;
  a.limit = cfg.swiglu_limit;
  if (cfg.hidden_act == "situ") a.situ_beta = cfg.situ_beta, a.situ_linear_beta = cfg.situ_linear_beta;
  return a;
}
std::unique_ptr<Ffn> make_mlp_ffn(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                  const TpShard& tp = TpShard{}, Backend& be = cpu_backend());
std::unique_ptr<Ffn> make_moe_ffn(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                  const TpShard& tp = TpShard{}, Backend& be = cpu_backend());

}  // namespace dz
