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
#include "model/attn_cache.hpp"

namespace dz {

namespace {

class GqaMixer : public Mixer {
 public:
  GqaMixer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, const TpShard& tp, Backend& be)
      : be_(&be) {
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
    const bool shard = tp.size > 1 && !ck.keeps_full();
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
    const Tensor q = slice_rows(ck.get(p + "q_proj.weight", {H_ * qpw, D_}, Init::normal(0.02f)), h0 * qpw, h1 * qpw);
    const Tensor q_bias = slice_rows(ck.get_optional(p + "q_proj.bias", {H_ * qpw}, Init::zeros()), h0 * qpw, h1 * qpw);
    const Tensor k = slice_rows(ck.get(p + "k_proj.weight", {Hkv_ * Dh_, D_}, Init::normal(0.02f)), g0 * Dh_, g1 * Dh_);
    const Tensor k_bias = slice_rows(ck.get_optional(p + "k_proj.bias", {Hkv_ * Dh_}, Init::zeros()), g0 * Dh_, g1 * Dh_);
    const Tensor v = slice_rows(ck.get(p + "v_proj.weight", {Hkv_ * Dh_, D_}, Init::normal(0.02f)), g0 * Dh_, g1 * Dh_);
    const Tensor v_bias = slice_rows(ck.get_optional(p + "v_proj.bias", {Hkv_ * Dh_}, Init::zeros()), g0 * Dh_, g1 * Dh_);
    const Tensor o = slice_cols(ck.get(p + "o_proj.weight", {D_, H_ * Dh_}, Init::normal(0.02f)), h0 * Dh_, h1 * Dh_);
    Tensor o_bias = ck.get_optional(p + "o_proj.bias", {D_}, Init::zeros());
    if (shard && tp.rank != 0) o_bias = Tensor();  // added once, before the all-reduce sums the ranks
    const Tensor q_norm = ck.get(p + "q_norm.weight", {Dh_}, norm_init);
    const Tensor k_norm = ck.get(p + "k_norm.weight", {Dh_}, norm_init);
    // transformers: dim = int(head_dim * partial_rotary_factor)
    const int64_t rot = int64_t(double(Dh_) * double(cfg.rope.partial_rotary_factor));
    DZ_CHECK(rot >= 0 && rot <= Dh_ && rot % 2 == 0, p, ": rotary dim ", rot, " must be even and <= head_dim");
    if (rot > 0) {
      RopeConfig rc = cfg.rope;
      rc.style = RopeStyle::NeoX;
      rope_ = std::make_unique<Rope>(rc, rot);
    }
    scale_ = float(1.0 / std::sqrt(double(Dh_)));
    if (q.empty()) return;  // dry run (inspect): names and shapes only
    auto par = [&](const Tensor& t) { return t.empty() ? DTensor{} : be.param(t); };
    if (gated_) {
      // q_proj rows per head are [query (Dh) | gate (Dh)]: split them once here into a query and a
      // gate projection (row permutation: every output value is unchanged).
      const int64_t QD = Hl_ * Dh_;
      Tensor wq({QD, D_}), wg({QD, D_}), bq, bg;
      if (!q_bias.empty()) bq = Tensor({QD}), bg = Tensor({QD});
      for (int64_t h = 0; h < Hl_; ++h) {
        std::copy(q.data.begin() + (2 * h) * Dh_ * D_, q.data.begin() + (2 * h + 1) * Dh_ * D_, wq.data.begin() + h * Dh_ * D_);
        std::copy(q.data.begin() + (2 * h + 1) * Dh_ * D_, q.data.begin() + (2 * h + 2) * Dh_ * D_, wg.data.begin() + h * Dh_ * D_);
        if (!q_bias.empty()) {
          std::copy(q_bias.data.begin() + 2 * h * Dh_, q_bias.data.begin() + (2 * h + 1) * Dh_, bq.data.begin() + h * Dh_);
          std::copy(q_bias.data.begin() + (2 * h + 1) * Dh_, q_bias.data.begin() + (2 * h + 2) * Dh_, bg.data.begin() + h * Dh_);
        }
      }
      q_ = be.weight(wq);
      gate_ = be.weight(wg);
      q_bias_ = par(bq);
      gate_bias_ = par(bg);
    } else {
      q_ = be.weight(q);
      q_bias_ = par(q_bias);
    }
    k_ = be.weight(k);
    k_bias_ = par(k_bias);
    v_ = be.weight(v);
    v_bias_ = par(v_bias);
    o_ = be.weight(o);
    o_bias_ = par(o_bias);
    q_norm_ = be.param(q_norm);
    k_norm_ = be.param(k_norm);
  }

  int64_t hidden() const override { return D_; }
  using Mixer::forward;
  using Mixer::forward_cp;

  std::unique_ptr<MixerState> make_state() const override {
    auto st = std::make_unique<AttnCache>();
    st->k.init(*be_, Hkvl_ * Dh_, be_->act_dtype());
    st->v.init(*be_, Hkvl_ * Dh_, be_->act_dtype());
    return st;
  }

  void forward(const DTensor& x, MixerState& st_base, const DTensor& out) const override {
    auto* st = dynamic_cast<AttnCache*>(&st_base);
    DZ_CHECK(st, "GQA mixer: state is not an attention cache");
    const int64_t T = x.rows(), pos0 = st->pos, S = pos0 + T;
    DZ_CHECK(st->k.rows() == pos0 && st->v.rows() == pos0, "GQA mixer: cache size does not match position ", pos0);
    DTensor q = be_->act({T, Hl_ * Dh_}), gate = gated_ ? be_->act({T, Hl_ * Dh_}) : DTensor{};
    DTensor k = st->k.append(T), v = st->v.append(T);
    project(x, pos0, q, gate, k, v);
    DTensor o = be_->act({T, Hl_ * Dh_});  // [T, Hl, Dh]
    if (T > 0) attend(q, st->k.view(0, S), st->v.view(0, S), pos0, o);
    finish(o, gate, out);
    st->pos = S;
  }

  // A packed prefill (every state fresh): projections, norms, gate and o_proj once over all rows,
  // RoPE and the attention varlen (each document from position 0 over its own keys, one call),
  // each document's k / v rows appended to its cache. Equal to forward() per document, bitwise on
  // the CPU (every op there is per row, the attention per document). One token per document (a
  // decode step): decode_packed. Other states with history (continuations) or a single document:
  // the per-document default.
  void forward_packed(const DTensor& x, const std::vector<int64_t>& cu, const std::vector<MixerState*>& sts,
                      const DTensor& out) const override {
    const int64_t N = int64_t(cu.size()) - 1, T = x.rows(), kvw = Hkvl_ * Dh_;
    bool fresh = false;
    const std::vector<AttnCache*> st = packed_caches(cu, sts, T, "GQA", &fresh);
    if (N > 1 && T == N) {  // one token per document (a batched decode step)
      decode_packed(x, st, out);
      return;
    }
    if (!fresh || st.size() == 1) {  // history, or one document: forward() itself
      Mixer::forward_packed(x, cu, sts, out);
      return;
    }
    DTensor q = be_->act({T, Hl_ * Dh_}), gate = gated_ ? be_->act({T, Hl_ * Dh_}) : DTensor{};
    DTensor k = be_->act({T, kvw}), v = be_->act({T, kvw});  // [T, Hkvl, Dh] of every document
    project_rows(x, q, gate, k, v);
    if (rope_ && T > 0) {
      be_->rope_varlen(*rope_, q, Hl_, Dh_, 0, cu);
      be_->rope_varlen(*rope_, k, Hkvl_, Dh_, 0, cu);
    }
    for (int64_t b = 0; b < N; ++b) {
      const int64_t r0 = cu[size_t(b)], n = cu[size_t(b) + 1] - r0;
      if (n > 0) {
        be_->copy_rows(k, r0, st[size_t(b)]->k.append(n), 0, n);
        be_->copy_rows(v, r0, st[size_t(b)]->v.append(n), 0, n);
      }
      st[size_t(b)]->pos = n;
    }
    DTensor o = be_->act({T, Hl_ * Dh_});  // [T, Hl, Dh]
    if (T > 0) attend(q, k, v, 0, o, cu);
    finish(o, gate, out);
  }

  // One token of each of N documents: projections, norms, gate and o_proj once over the N rows;
  // RoPE once, each row at its own position (rope_rows); per document the cache append and the
  // attention over its keys. Equal to forward() per document (bitwise on the CPU: every op there is per row).
  void decode_packed(const DTensor& x, const std::vector<AttnCache*>& st, const DTensor& out) const {
    const int64_t N = x.rows(), kvw = Hkvl_ * Dh_;
    DTensor q = be_->act({N, Hl_ * Dh_}), gate = gated_ ? be_->act({N, Hl_ * Dh_}) : DTensor{};
    DTensor k = be_->act({N, kvw}), v = be_->act({N, kvw});
    project_rows(x, q, gate, k, v);
    std::vector<int64_t> pos(static_cast<size_t>(N));
    for (int64_t b = 0; b < N; ++b) {
      pos[size_t(b)] = st[size_t(b)]->pos;
      DZ_CHECK(st[size_t(b)]->k.rows() == pos[size_t(b)] && st[size_t(b)]->v.rows() == pos[size_t(b)],
               "GQA mixer: cache size does not match position ", pos[size_t(b)]);
    }
    if (rope_) {
      be_->rope_rows(*rope_, q, Hl_, Dh_, 0, pos);
      be_->rope_rows(*rope_, k, Hkvl_, Dh_, 0, pos);
    }
    DTensor o = be_->act({N, Hl_ * Dh_});  // [N, Hl, Dh]
    for (int64_t b = 0; b < N; ++b) {
      AttnCache& c = *st[size_t(b)];
      const int64_t pos0 = c.pos, S = pos0 + 1;
      DTensor qb = q.slab(b, b + 1), kb = k.slab(b, b + 1), ob = o.slab(b, b + 1);
      be_->copy_rows(kb, 0, c.k.append(1), 0, 1);
      be_->copy_rows(v, b, c.v.append(1), 0, 1);
      attend(qb, c.k.view(0, S), c.v.view(0, S), pos0, ob);
      c.pos = S;
    }
    finish(o, gate, out);
  }

  void forward_cp(const DTensor& x, const CpCtx& ctx, MixerState& st_base, const DTensor& out) const override {
    auto* st = dynamic_cast<AttnCache*>(&st_base);
    DZ_CHECK(st, "GQA mixer: state is not an attention cache");
    DZ_CHECK(st->pos == 0 && st->k.rows() == 0, "GQA forward_cp: the state must be fresh (pos ", st->pos, ")");
    DZ_CHECK(ctx.cp && ctx.lay, "GQA forward_cp: missing CP group or layout");
    const SeqLayout& lay = *ctx.lay;
    DZ_CHECK(lay.cp_size == ctx.cp->size() && lay.cp_rank == ctx.cp->rank(), "GQA forward_cp: layout for rank ",
             lay.cp_rank, " of ", lay.cp_size, " used on rank ", ctx.cp->rank(), " of ", ctx.cp->size());
    const int64_t L = lay.length, Rl = lay.local_rows(), kvw = Hkvl_ * Dh_;
    const std::vector<int> segs = lay.local_segments();

    // 1. Local entries [Rl, k | v], each segment at its global positions, started to every CP rank.
    DTensor kv = be_->act({Rl, 2 * kvw});  // the entries to share: [k | v] per local row
    std::unique_ptr<PendingRows> gather;
    {
      DTensor k = be_->act({Rl, kvw}), v = be_->act({Rl, kvw});
      lay.each_local_segment([&](int64_t r, int64_t T, int64_t pos0) {
        project_kv(x.slab(r, r + T), pos0, k.slab(r, r + T), v.slab(r, r + T));
      });
      be_->copy_cols(k, 0, kv, 0, kvw);
      be_->copy_cols(v, 0, kv, kvw, kvw);
      gather = cp_gather_seq_start(*be_, ctx, kv);  // on the backend's buffers
    }
    // 2. The local queries while the entries travel (a transport that overlaps: the CPU's MPI).
    DTensor q = be_->act({Rl, Hl_ * Dh_}), gate = gated_ ? be_->act({Rl, Hl_ * Dh_}) : DTensor{};
    lay.each_local_segment([&](int64_t r, int64_t T, int64_t pos0) {
      project_q(x.slab(r, r + T), pos0, q.slab(r, r + T), gated_ ? gate.slab(r, r + T) : DTensor{});
    });
    {
      auto tm = ctx.time("kv_gather");  // what is left of the exchange after the queries
      const DTensor full = gather->wait();  // [L, k | v]
      be_->copy_cols(full, 0, st->k.append(L), 0, kvw);
      be_->copy_cols(full, kvw, st->v.append(L), 0, kvw);
      st->pos = L;
    }

    // 3. Attention for the local queries, segment by segment.
    DTensor o = be_->act({Rl, Hl_ * Dh_});  // [Rl, Hl, Dh]
    int64_t r = 0;
    for (int j : segs) {
      const int64_t T = lay.seg_len(j), pos0 = lay.seg_begin(j);
      if (T == 0) continue;
      auto tm = ctx.time("attention");
      DTensor os = o.slab(r, r + T);
      attend(q.slab(r, r + T), st->k.view(0, pos0 + T), st->v.view(0, pos0 + T), pos0, os);
      // visible keys × local query heads × (Dh for q·k + Dh for p·v) × 2
      const double keys = double(T) * double(pos0) + double(T) * double(T + 1) / 2;
      ctx.flops("attention", keys * double(Hl_) * double(2 * Dh_) * 2);
      r += T;
    }
    finish(o, gate, out);
  }

 private:
  // x [T, D] at positions pos0 .. -> q [T, Hl*Dh] (normed, rotated), gate [T, Hl*Dh] (when
  // gated), k [T, Hkvl*Dh] (normed, rotated), v [T, Hkvl*Dh].
  void project(const DTensor& x, int64_t pos0, const DTensor& q, const DTensor& gate, const DTensor& k, const DTensor& v) const {
    project_q(x, pos0, q, gate);
    project_kv(x, pos0, k, v);
  }
  // The queries' half of project (forward_cp runs it while the keys and values travel) and the
  // keys' and values' half.
  void project_q(const DTensor& x, int64_t pos0, const DTensor& q, const DTensor& gate) const {
    if (x.rows() == 0) return;
    project_q_rows(x, q, gate);
    if (rope_) be_->rope(*rope_, q, Hl_, Dh_, 0, pos0);
  }
  void project_kv(const DTensor& x, int64_t pos0, const DTensor& k, const DTensor& v) const {
    if (x.rows() == 0) return;
    project_kv_rows(x, k, v);
    if (rope_) be_->rope(*rope_, k, Hkvl_, Dh_, 0, pos0);
  }
  // The same before RoPE: every op per row.
  void project_rows(const DTensor& x, const DTensor& q, const DTensor& gate, const DTensor& k, const DTensor& v) const {
    project_q_rows(x, q, gate);
    project_kv_rows(x, k, v);
  }
  void project_q_rows(const DTensor& x, const DTensor& q, const DTensor& gate) const {
    const int64_t T = x.rows();
    if (T == 0) return;
    Backend& be = *be_;
    be.linear(x, q_, q_bias_, q);
    if (gated_) be.linear(x, gate_, gate_bias_, gate);
    DTensor qh = q.reshaped({T * Hl_, Dh_});
    be.rmsnorm(qh, q_norm_, qh, eps_, zero_centered_);
  }
  void project_kv_rows(const DTensor& x, const DTensor& k, const DTensor& v) const {
    const int64_t T = x.rows();
    if (T == 0) return;
    Backend& be = *be_;
    be.linear(x, k_, k_bias_, k);
    be.linear(x, v_, v_bias_, v);
    DTensor kh = k.reshaped({T * Hkvl_, Dh_});
    be.rmsnorm(kh, k_norm_, kh, eps_, zero_centered_);
  }

  // cu: varlen offsets (AttnArgs::cu; pos0 0), or empty.
  void attend(const DTensor& q, const DTensor& k, const DTensor& v, int64_t pos0, DTensor& o,
              const std::vector<int64_t>& cu = {}) const {
    AttnArgs a;
    a.cu = cu;
    a.q = q;
    a.k = k;
    a.v = v;
    a.out = o;
    a.pos0 = pos0;
    a.Hq = Hl_;
    a.Hkv = Hkvl_;
    a.Dk = Dh_;
    a.Dv = Dh_;
    a.scale = scale_;
    be_->attention(a);
  }

  // o [T, Hl*Dh] -> out [T, D]: output gate, o_proj over this rank's heads, TP all-reduce.
  void finish(DTensor& o, const DTensor& gate, const DTensor& out) const {
    if (o.rows() > 0) {
      if (gated_) be_->mul_sigmoid(o, gate);
      be_->linear(o, o_, o_bias_, out);
    }
    tp_.allreduce(*be_, out);
  }

  Backend* be_;
  int64_t D_ = 0, H_ = 0, Hkv_ = 0, Hl_ = 0, Hkvl_ = 0, Dh_ = 0;
  float eps_ = 1e-6f, scale_ = 1.f;
  bool gated_ = true, zero_centered_ = true;
  TpShard tp_;              // size 1 unless loaded sharded
  DTensor q_, q_bias_;      // [Hl*Dh, D]: the query rows of q_proj
  DTensor gate_, gate_bias_;// [Hl*Dh, D]: the gate rows of q_proj (when gated)
  DTensor k_, k_bias_;      // [Hkvl*Dh, D]
  DTensor v_, v_bias_;      // [Hkvl*Dh, D]
  DTensor o_, o_bias_;      // [D, Hl*Dh], [D] (bias on TP rank 0 only)
  DTensor q_norm_, k_norm_; // [Dh]
  std::unique_ptr<Rope> rope_;
};

}  // namespace

std::unique_ptr<Mixer> make_gqa_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp, Backend& be) {
  (void)layer;  // every qwen3_next full-attention layer has the same structure
  return std::make_unique<GqaMixer>(cfg, ck, prefix, tp, be);
}

}  // namespace dz
