// Gated grouped-query attention (Qwen3-Next full-attention layers).
//
// Per token (x = the layer's normed input), as transformers' qwen3_next:
//   q_proj(x) viewed [H, 2*Dh]: per head the first Dh are the query, the next Dh the gate
//   (interleaved per head, not two halves of the whole projection); without the output gate
//   q_proj is [H*Dh] plain.
//   q = q_norm(q), k = q_norm-style k_norm(k_proj(x)): zero-centred RMSNorm ((1 + w) weight,
//   eps rms_norm_eps) over each head's Dh.
//   RoPE, NeoX (rotate halves), on the first rot = Dh * partial_rotary_factor dims of each head.
//   o = softmax(q·k / sqrt(Dh)) v over the causal keys, GQA groups of H / Hkv query heads.
//   o *= sigmoid(gate);  out = o_proj(o)
// The cache keeps k (after norm and RoPE) and v per token.
//
// Tensor parallelism: each rank keeps its query heads (q_proj rows: query + gate per head), its
// KV heads (num_key_value_heads % tp == 0, so every query group stays on one rank) and the
// matching o_proj columns; the output is all-reduced. The cache then holds this rank's KV heads.
// Context parallelism (forward_cp): k / v of the local rows are all-gathered over the CP group
// into the full cache; each rank attends for its own queries.
#include <algorithm>
#include <cmath>
#include <memory>
#include <tuple>

#include "core/error.hpp"
#include "core/linalg.hpp"
#include "model/module.hpp"
#include "ops/attention.hpp"
#include "ops/norm.hpp"
#include "ops/rope.hpp"

namespace dz {

namespace {

const float* opt(const Tensor& t) { return t.empty() ? nullptr : t.ptr(); }

class GqaMixer : public Mixer {
 public:
  GqaMixer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, const TpShard& tp) {
    D_ = cfg.hidden_size;
    H_ = cfg.num_heads;
    Hkv_ = cfg.num_kv_heads;
    Dh_ = cfg.head_dim;
    eps_ = cfg.rms_norm_eps;
    gated_ = cfg.attn_output_gate || cfg.family == Family::Qwen3Next;  // qwen3_next always gates
    // qwen3_next's q/k norms are always the zero-centred (Gemma-style) RMSNorm.
    zero_centered_ = cfg.family == Family::Qwen3Next || cfg.norm_zero_centered;
    const std::string p = prefix + "self_attn.";
    DZ_CHECK(D_ > 0 && H_ > 0 && Hkv_ > 0 && Dh_ > 0 && H_ % Hkv_ == 0, p, ": bad GQA dims (heads ", H_,
             ", kv heads ", Hkv_, ", head_dim ", Dh_, ")");
    // Generating mode (make-model) asks for and keeps the full tensors: it never runs sharded.
    const bool shard = tp.size > 1 && !ck.generating();
    int64_t h0 = 0, h1 = H_, g0 = 0, g1 = Hkv_;
    if (shard) {
      tp_ = tp;
      DZ_CHECK(Hkv_ % tp.size == 0, p, ": num_key_value_heads (", Hkv_, ") is not divisible by --tp ", tp.size,
               " (KV heads are sharded with their query groups, not replicated)");
      std::tie(h0, h1) = tp.range(H_, (p + "num_attention_heads").c_str());
      std::tie(g0, g1) = tp.range(Hkv_, (p + "num_key_value_heads").c_str());
    }
    Hl_ = h1 - h0;
    Hkvl_ = g1 - g0;
    const int64_t qpw = Dh_ * (gated_ ? 2 : 1);  // q_proj rows per head (query, then gate)
    const Init norm_init = zero_centered_ ? Init::zeros() : Init::ones();
    q_ = slice_rows(ck.get(p + "q_proj.weight", {H_ * qpw, D_}, Init::normal(0.02f)), h0 * qpw, h1 * qpw);
    q_bias_ = slice_rows(ck.get_optional(p + "q_proj.bias", {H_ * qpw}, Init::zeros()), h0 * qpw, h1 * qpw);
    k_ = slice_rows(ck.get(p + "k_proj.weight", {Hkv_ * Dh_, D_}, Init::normal(0.02f)), g0 * Dh_, g1 * Dh_);
    k_bias_ = slice_rows(ck.get_optional(p + "k_proj.bias", {Hkv_ * Dh_}, Init::zeros()), g0 * Dh_, g1 * Dh_);
    v_ = slice_rows(ck.get(p + "v_proj.weight", {Hkv_ * Dh_, D_}, Init::normal(0.02f)), g0 * Dh_, g1 * Dh_);
    v_bias_ = slice_rows(ck.get_optional(p + "v_proj.bias", {Hkv_ * Dh_}, Init::zeros()), g0 * Dh_, g1 * Dh_);
    o_ = slice_cols(ck.get(p + "o_proj.weight", {D_, H_ * Dh_}, Init::normal(0.02f)), h0 * Dh_, h1 * Dh_);
    o_bias_ = ck.get_optional(p + "o_proj.bias", {D_}, Init::zeros());
    if (shard && tp.rank != 0) o_bias_ = Tensor();  // added once, before the all-reduce sums the ranks
    q_norm_ = ck.get(p + "q_norm.weight", {Dh_}, norm_init);
    k_norm_ = ck.get(p + "k_norm.weight", {Dh_}, norm_init);
    // transformers: dim = int(head_dim * partial_rotary_factor)
    const int64_t rot = int64_t(double(Dh_) * double(cfg.rope.partial_rotary_factor));
    DZ_CHECK(rot >= 0 && rot <= Dh_ && rot % 2 == 0, p, ": rotary dim ", rot, " must be even and <= head_dim");
    if (rot > 0) {
      RopeConfig rc = cfg.rope;
      rc.style = RopeStyle::NeoX;
      rope_ = std::make_unique<Rope>(rc, rot);
    }
    scale_ = float(1.0 / std::sqrt(double(Dh_)));
  }

  std::unique_ptr<MixerState> make_state() const override { return std::make_unique<AttnCache>(); }

  void forward(const float* x, int64_t T, MixerState& st_base, float* out) const override {
    auto* st = dynamic_cast<AttnCache*>(&st_base);
    DZ_CHECK(st, "GQA mixer: state is not an attention cache");
    const int64_t pos0 = st->pos, S = pos0 + T, kvw = Hkvl_ * Dh_;
    DZ_CHECK(int64_t(st->k.size()) == pos0 * kvw && int64_t(st->v.size()) == pos0 * kvw,
             "GQA mixer: cache size does not match position ", pos0);
    std::vector<float> q(size_t(T * Hl_ * Dh_)), gate(gated_ ? q.size() : 0);  // [T, Hl, Dh]
    st->k.resize(size_t(S * kvw));
    st->v.resize(size_t(S * kvw));
    project(x, T, pos0, q.data(), gate.data(), st->k.data() + pos0 * kvw, st->v.data() + pos0 * kvw);
    std::vector<float> o(size_t(T * Hl_ * Dh_));  // [T, Hl, Dh]
    if (T > 0)
      causal_attention(q.data(), st->k.data(), st->v.data(), o.data(), T, pos0, S, Hl_, Hkvl_, Dh_, Dh_, scale_);
    finish(T, o.data(), gate.data(), out);
    st->pos = S;
  }

  void forward_cp(const float* x, const CpCtx& ctx, MixerState& st_base, float* out) const override {
    auto* st = dynamic_cast<AttnCache*>(&st_base);
    DZ_CHECK(st, "GQA mixer: state is not an attention cache");
    DZ_CHECK(st->pos == 0 && st->k.empty(), "GQA forward_cp: the state must be fresh (pos ", st->pos, ")");
    DZ_CHECK(ctx.cp && ctx.lay, "GQA forward_cp: missing CP group or layout");
    const SeqLayout& lay = *ctx.lay;
    DZ_CHECK(lay.cp_size == ctx.cp->size() && lay.cp_rank == ctx.cp->rank(), "GQA forward_cp: layout for rank ",
             lay.cp_rank, " of ", lay.cp_size, " used on rank ", ctx.cp->rank(), " of ", ctx.cp->size());
    const int64_t L = lay.length, Rl = lay.local_rows(), kvw = Hkvl_ * Dh_;
    const std::vector<int> segs = lay.local_segments();

    // 1. Local rows, each segment at its global positions; entries [Rl, k | v].
    std::vector<float> q(size_t(Rl * Hl_ * Dh_)), gate(gated_ ? q.size() : 0), mine(size_t(Rl * 2 * kvw));
    {
      std::vector<float> k, v;
      int64_t r = 0;
      for (int j : segs) {
        const int64_t T = lay.seg_len(j), pos0 = lay.seg_begin(j);
        k.resize(size_t(T * kvw));
        v.resize(size_t(T * kvw));
        project(x + r * D_, T, pos0, q.data() + r * Hl_ * Dh_, gated_ ? gate.data() + r * Hl_ * Dh_ : nullptr,
                k.data(), v.data());
        for (int64_t t = 0; t < T; ++t) {
          std::copy(k.begin() + t * kvw, k.begin() + (t + 1) * kvw, mine.begin() + (r + t) * 2 * kvw);
          std::copy(v.begin() + t * kvw, v.begin() + (t + 1) * kvw, mine.begin() + (r + t) * 2 * kvw + kvw);
        }
        r += T;
      }
    }

    // 2. Gather (grouped by rank, each in its segment order) into the full cache in sequence order.
    {
      auto tm = ctx.time("kv_gather");
      const std::vector<float> all = ctx.cp->allgatherv(mine);
      DZ_CHECK(int64_t(all.size()) == L * 2 * kvw, "GQA forward_cp: gathered ", all.size() / size_t(2 * kvw),
               " cache rows for a document of ", L);
      st->k.resize(size_t(L * kvw));
      st->v.resize(size_t(L * kvw));
      const float* e = all.data();
      for (int rank = 0; rank < lay.cp_size; ++rank)
        for (int j : lay.segments_of(rank))
          for (int64_t s = lay.seg_begin(j); s < lay.seg_begin(j) + lay.seg_len(j); ++s, e += 2 * kvw) {
            std::copy(e, e + kvw, st->k.data() + s * kvw);
            std::copy(e + kvw, e + 2 * kvw, st->v.data() + s * kvw);
          }
      st->pos = L;
    }

    // 3. Attention for the local queries, segment by segment.
    std::vector<float> o(size_t(Rl * Hl_ * Dh_));  // [Rl, Hl, Dh]
    int64_t r = 0;
    for (int j : segs) {
      const int64_t T = lay.seg_len(j), pos0 = lay.seg_begin(j);
      if (T == 0) continue;
      auto tm = ctx.time("attention");
      causal_attention(q.data() + r * Hl_ * Dh_, st->k.data(), st->v.data(), o.data() + r * Hl_ * Dh_, T, pos0,
                       pos0 + T, Hl_, Hkvl_, Dh_, Dh_, scale_);
      // visible keys × local query heads × (Dh for q·k + Dh for p·v) × 2
      const double keys = double(T) * double(pos0) + double(T) * double(T + 1) / 2;
      ctx.flops("attention", keys * double(Hl_) * double(2 * Dh_) * 2);
      r += T;
    }
    finish(Rl, o.data(), gate.data(), out);
  }

 private:
  // x [T, D] at positions pos0 .. -> q [T, Hl, Dh] (normed, rotated), gate [T, Hl, Dh] (when
  // gated), k [T, Hkvl, Dh] (normed, rotated), v [T, Hkvl, Dh].
  void project(const float* x, int64_t T, int64_t pos0, float* q, float* gate, float* k, float* v) const {
    if (T == 0) return;
    const int64_t qw = Hl_ * Dh_ * (gated_ ? 2 : 1), kvw = Hkvl_ * Dh_;
    std::vector<float> qg(size_t(T * qw));  // [T, Hl, (2)Dh]
    linear(x, q_.ptr(), opt(q_bias_), qg.data(), T, D_, qw);
    if (gated_) {
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < Hl_; ++h) {
          const float* src = qg.data() + (t * Hl_ + h) * 2 * Dh_;
          std::copy(src, src + Dh_, q + (t * Hl_ + h) * Dh_);
          std::copy(src + Dh_, src + 2 * Dh_, gate + (t * Hl_ + h) * Dh_);
        }
    } else {
      std::copy(qg.begin(), qg.end(), q);
    }
    rmsnorm(q, q_norm_.ptr(), q, T * Hl_, Dh_, eps_, zero_centered_);
    linear(x, k_.ptr(), opt(k_bias_), k, T, D_, kvw);
    linear(x, v_.ptr(), opt(v_bias_), v, T, D_, kvw);
    rmsnorm(k, k_norm_.ptr(), k, T * Hkvl_, Dh_, eps_, zero_centered_);
    if (rope_) {
      rope_->apply(q, T, Hl_, Dh_, 0, pos0);
      rope_->apply(k, T, Hkvl_, Dh_, 0, pos0);
    }
  }

  // o [T, Hl*Dh] -> out [T, D]: output gate, o_proj over this rank's heads, TP all-reduce.
  void finish(int64_t T, float* o, const float* gate, float* out) const {
    if (T > 0) {
      if (gated_)
        for (int64_t i = 0; i < T * Hl_ * Dh_; ++i) o[i] *= sigmoid(gate[i]);
      linear(o, o_.ptr(), opt(o_bias_), out, T, Hl_ * Dh_, D_);
    }
    tp_.allreduce_sum(out, T * D_);
  }

  int64_t D_ = 0, H_ = 0, Hkv_ = 0, Hl_ = 0, Hkvl_ = 0, Dh_ = 0;
  float eps_ = 1e-6f, scale_ = 1.f;
  bool gated_ = true, zero_centered_ = true;
  TpShard tp_;             // size 1 unless loaded sharded
  Tensor q_, q_bias_;      // [Hl*Dh*(2 if gated), D]
  Tensor k_, k_bias_;      // [Hkvl*Dh, D]
  Tensor v_, v_bias_;      // [Hkvl*Dh, D]
  Tensor o_, o_bias_;      // [D, Hl*Dh], [D] (bias on TP rank 0 only)
  Tensor q_norm_, k_norm_; // [Dh]
  std::unique_ptr<Rope> rope_;
};

}  // namespace

std::unique_ptr<Mixer> make_gqa_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp) {
  (void)layer;  // every qwen3_next full-attention layer has the same structure
  return std::make_unique<GqaMixer>(cfg, ck, prefix, tp);
}

}  // namespace dz
