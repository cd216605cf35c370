// Multi-head latent attention (MLA) token mixer, dense or with the DSA indexer (sparse Top-K).
//
// Per token (x = the layer's normed input):
//   q       = q_proj(x)  or  q_b_proj(q_a_layernorm(q_a_proj(x)))        [H, nope + rope]
//   [c, kr] = kv_a_proj_with_mqa(x);  c = kv_a_layernorm(c)               c [R], kr [rope]
//   RoPE on q[:, nope:] and kr (DeepSeek: interleaved pairs; Kimi: none, see below)
//   k[h] = [W_uk[h] c, kr],  v[h] = W_uv[h] c                             (kv_b_proj rows per head:
//                                                                          nope of W_uk, then vd of W_uv)
//   o    = softmax(scale q·k) v over the causal (or Top-K) keys          [H, vd]
//   o   *= sigmoid(g_proj(x))   (Kimi K3 mla_use_output_gate)
//   out  = o_proj(o)
// The cache keeps one row [c | kr] per token (what an MLA cache holds). Two equal forms of the
// attention (DeepSeek's "naive" and "absorb"):
// - explicit: k and v of every cached token expanded through kv_b_proj (S x H x (nope + vd) x R
//   MACs per call), then attention with head dims nope + rope / vd — cheap when the T queries are
//   many (prefill), since the expansion is shared;
// - absorbed: W_uk folded into the queries (q_lat = W_uk^T q_nope), attention straight on the
//   cache rows with one KV head (keys [c | kr], values c), W_uv applied to the [H, R] result —
//   no per-token expansion, so a decode step costs O(S x H x (2R + rope)) instead of
//   O(S x H x (nope + vd) x R).
// forward() takes whichever needs fewer FLOPs for its (T, pos0, selection) (use_absorbed), except
// that a DSA selection on a backend with a fused latent kernel (cuda) always takes the absorbed
// form (sparse_absorbed: shared gathered rows on tensor cores); mla_attention_absorbed (ops/attention.hpp) is the fp32 reference
// of the absorbed form and is tested equal to the explicit one.
//
// RoPE conventions found in the references:
// - deepseek_v32: DeepSeek's code rotates interleaved pairs; transformers de-interleaves the rope
//   slice then rotates halves, which applies the same rotation to q and k in a permuted layout,
//   so every q·k (all attention sees) is identical to RopeStyle::Interleaved, which we use.
// - kimi_linear: transformers' KimiLinearAttention applies no RoPE at all (`mla_use_nope`); the
//   kr slice is used as is. Dayzero presets follow Kimi unless config.json says mla_use_nope=false.
// Softmax scale: (nope + rope)^-0.5 × Rope::softmax_scale_mult() (YaRN mscale², DeepSeek).
// q_a_layernorm / kv_a_layernorm use eps 1e-6 (both modeling files build them with the default
// eps, not rms_norm_eps).
//
// Tensor parallelism (TpShard, docs/parallel_attention.md): each rank keeps the rows of its heads
// in q_proj / q_b_proj, kv_b_proj and g_proj and the matching columns of o_proj; q_a / kv_a and
// their norms (the latent) and the DSA indexer's weights are replicated, so every TP rank holds
// the same latent cache and the same Top-K sets (long prefills split the indexer's query rows over
// the TP ranks and all-gather the Top-K rows). The output is all-reduced over the TP group.
// Context parallelism (forward_cp): local rows are projected, their cache entries (latent, k_pe,
// indexer key) all-gathered over the CP group into the full cache, then every rank scores and
// attends for its own queries, segment by segment.
#include <algorithm>
#include <cmath>
#include <memory>
#include <tuple>

#include "core/error.hpp"
#include "core/fp8.hpp"
#include "core/linalg.hpp"
#include "model/module.hpp"
#include "ops/attention.hpp"
#include "ops/indexer.hpp"
#include "ops/norm.hpp"
#include "ops/rope.hpp"
#include "model/attn_cache.hpp"
#include "model/dsa_indexer.hpp"

namespace dz {

// The writer appends each selection it makes; a new call starts (the list is cleared) at the
// writer's first selection after any reader has taken one. Each reader walks the list with its
// own cursor, reset when the list starts again. The layers run in order, every reader after its
// writer, and each makes the same sequence of selections (same documents, same rows), so reader
// call i gets writer call i. The handles keep the device buffers alive until the next call (a
// CUDA graph records the same buffers for writer and reader).
struct TopkShare {
  std::vector<DTensor> sels;
  uint64_t gen = 0;
  bool taken = false;
  std::vector<std::pair<uint64_t, size_t>> cursor;  // per reader: (gen, next index)

  void put(const DTensor& s) {
    if (taken) sels.clear(), ++gen, taken = false;
    sels.push_back(s);
  }
  void take(int reader, const DTensor& dst, Backend& be) {
    if (cursor.size() <= size_t(reader)) cursor.resize(size_t(reader) + 1, {~uint64_t(0), 0});
    auto& c = cursor[size_t(reader)];
    if (c.first != gen) c = {gen, 0};
    DZ_CHECK(c.second < sels.size(), "DSA shared indexer: the layer it shares with made ", sels.size(),
             " selections in this call, this layer asks for selection ", c.second + 1);
    const DTensor& s = sels[c.second++];
    DZ_CHECK(s.shape == dst.shape, "DSA shared indexer: selection ", shape_str(s.shape), " for rows ", shape_str(dst.shape));
    taken = true;
    if (dst.rows() > 0) be.copy_rows(s, 0, dst, 0, dst.rows());
  }
};

namespace {


class MlaMixer : public Mixer {
 public:
  MlaMixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix, const TpShard& tp, Backend& be,
           const TopkLink& topk)
      : be_(&be) {
    D_ = cfg.hidden_size;
    H_ = cfg.num_heads;
    latent_eps_ = cfg.mla_latent_norm_eps;
    kv_fp8_ = cfg.kv_cache_fp8;
    q_lora_ = cfg.q_lora_rank;
    R_ = cfg.kv_lora_rank;
    nope_ = cfg.qk_nope_head_dim;
    rope_dim_ = cfg.qk_rope_head_dim;
    vd_ = cfg.v_head_dim;
    const std::string p = prefix + "self_attn.";
    DZ_CHECK(D_ > 0 && H_ > 0 && R_ > 0 && nope_ >= 0 && rope_dim_ >= 0 && vd_ > 0 && nope_ + rope_dim_ > 0,
             p, ": bad MLA dims (heads ", H_, ", kv_lora_rank ", R_, ", nope ", nope_, ", rope ", rope_dim_,
             ", v ", vd_, ")");
    DZ_CHECK(rope_dim_ % 2 == 0, p, ": qk_rope_head_dim must be even, got ", rope_dim_);
    // Generating mode (make-model) asks for and keeps the full tensors: it never runs sharded.
    const bool shard = tp.size > 1 && !ck.keeps_full();
    if (shard) tp_ = tp;
    int64_t h0 = 0, h1 = H_;
    if (shard) std::tie(h0, h1) = tp.range(H_, (p + "num_attention_heads").c_str());
    Hl_ = h1 - h0;
    const int64_t Dq = nope_ + rope_dim_;
    if (q_lora_ > 0) {
      hq_a_ = ck.get(p + "q_a_proj.weight", {q_lora_, D_}, Init::normal(0.02f));
      hq_a_bias_ = ck.get_optional(p + "q_a_proj.bias", {q_lora_}, Init::zeros());
      hq_a_norm_ = ck.get(p + "q_a_layernorm.weight", {q_lora_}, Init::ones());
      hq_b_ = slice_rows(ck.get(p + "q_b_proj.weight", {H_ * Dq, q_lora_}, Init::normal(0.02f)), h0 * Dq, h1 * Dq);
    } else {
      hq_ = slice_rows(ck.get(p + "q_proj.weight", {H_ * Dq, D_}, Init::normal(0.02f)), h0 * Dq, h1 * Dq);
    }
    hkv_a_ = ck.get(p + "kv_a_proj_with_mqa.weight", {R_ + rope_dim_, D_}, Init::normal(0.02f));
    hkv_a_bias_ = ck.get_optional(p + "kv_a_proj_with_mqa.bias", {R_ + rope_dim_}, Init::zeros());
    hkv_a_norm_ = ck.get(p + "kv_a_layernorm.weight", {R_}, Init::ones());
    hkv_b_ = slice_rows(ck.get(p + "kv_b_proj.weight", {H_ * (nope_ + vd_), R_}, Init::normal(0.02f)),
                    h0 * (nope_ + vd_), h1 * (nope_ + vd_));
    ho_ = slice_cols(ck.get(p + "o_proj.weight", {D_, H_ * vd_}, Init::normal(0.02f)), h0 * vd_, h1 * vd_);
    ho_bias_ = ck.get_optional(p + "o_proj.bias", {D_}, Init::zeros());
    if (shard && tp.rank != 0) ho_bias_ = Tensor();  // added once, before the all-reduce sums the ranks
    if (cfg.mla_output_gate)
      hg_ = slice_rows(ck.get(p + "g_proj.weight", {H_ * vd_, D_}, Init::normal(0.02f)), h0 * vd_, h1 * vd_);

    bool nope_family = cfg.family == Family::KimiLinear || cfg.family == Family::Glm5Next;
    if (cfg.family == Family::Dayzero) nope_family = cfg.raw.is_object() ? cfg.raw.value("mla_use_nope", true) : true;
    float mult = 1.f;
    if (!nope_family && rope_dim_ > 0) {
      RopeConfig rc = cfg.rope;
      rc.style = RopeStyle::Interleaved;
      rope_ = std::make_unique<Rope>(rc, rope_dim_);
      mult = rope_->softmax_scale_mult();
    }
    scale_ = float(1.0 / std::sqrt(double(Dq))) * mult;

    DZ_CHECK(layer >= 0 && size_t(layer) < cfg.layers.size(), p, ": layer ", layer, " outside the layer list");
    // The indexer's weights are replicated on every TP rank (docs/parallel_attention.md: sharding
    // its heads would all-reduce a [T, S] fp32 score matrix per layer); see select_topk.
    const LayerSpec& ls = cfg.layers[size_t(layer)];
    if (ls.has_indexer && !ls.shared_indexer) indexer_ = std::make_unique<DsaIndexer>(cfg, ck, p + "indexer.", be);
    DZ_CHECK(!ls.shared_indexer || topk.take, p, ": a shared-indexer layer needs an earlier layer that runs its indexer");
    sel_k_ = ls.has_indexer ? cfg.dsa_sel_width() : 0;
    topk_ = topk;
    if (hkv_a_.empty()) return;  // dry run (inspect): names and shapes only
    auto up = [&](const Tensor& t) { return t.empty() ? DTensor{} : be.weight(t); };
    auto par = [&](const Tensor& t) { return t.empty() ? DTensor{} : be.param(t); };
    q_ = up(hq_);
    q_a_ = up(hq_a_);
    q_a_bias_ = par(hq_a_bias_);
    q_a_norm_ = par(hq_a_norm_);
    q_b_ = up(hq_b_);
    kv_a_ = up(hkv_a_);
    kv_a_bias_ = par(hkv_a_bias_);
    kv_a_norm_ = par(hkv_a_norm_);
    kv_b_ = up(hkv_b_);
    // The absorbed form multiplies per head by W_uk / W_uv (head_matmul): weight_dtype(), so an
    // FP8-kept kv_b_proj gets a second, dequantised copy.
    kv_b_abs_ = kv_b_.block_scales ? be.upload(hkv_b_, be.weight_dtype()) : kv_b_;
    o_ = up(ho_);
    o_bias_ = par(ho_bias_);
    g_ = up(hg_);
    hq_ = hq_a_ = hq_a_bias_ = hq_a_norm_ = hq_b_ = hkv_a_ = hkv_a_bias_ = hkv_a_norm_ = hkv_b_ = ho_ = ho_bias_ = hg_ =
        Tensor();  // uploaded: the host copies go
  }

  int64_t hidden() const override { return D_; }
  using Mixer::forward;
  using Mixer::forward_cp;

  std::unique_ptr<MixerState> make_state() const override {
    auto st = std::make_unique<AttnCache>();
    st->latent.init(*be_, R_ + rope_dim_, be_->act_dtype());
    st->index_k.init(*be_, idx_dim(), be_->act_dtype());
    return st;
  }

  void forward(const DTensor& x, MixerState& st_base, const DTensor& out) const override {
    auto* st = dynamic_cast<AttnCache*>(&st_base);
    DZ_CHECK(st, "MLA mixer: state is not an attention cache");
    const int64_t T = x.rows(), pos0 = st->pos, S = pos0 + T, Dq = nope_ + rope_dim_;
    DZ_CHECK(st->latent.rows() == pos0 && st->index_k.rows() == (indexer_ ? pos0 : 0),
             "MLA mixer: cache size does not match position ", pos0);
    DTensor q = be_->act({T, Hl_ * Dq}), q_resid = be_->act({T, q_lora_});
    DTensor c = be_->act({T, R_}), kr = be_->act({T, rope_dim_});
    DTensor ki = indexer_ ? st->index_k.append(T) : DTensor{};
    project(x, pos0, q, q_resid, c, kr, ki);
    store(c, kr, st->latent.append(T));

    DTensor sel;
    if (sel_k_ > 0) {
      const int64_t n_sel = sel_k_;
      st->topk_width = n_sel;
      sel = be_->alloc({T, n_sel}, DType::I32);
      select_topk(x, q_resid, pos0, st->index_k.all(), sel);
      st->last_sel = {sel};
      st->sel_be = be_;
    }
    DTensor o = be_->act({T, Hl_ * vd_});
    if (T > 0) attend(*st, S, q, pos0, sel, o);
    finish(x, o, out);
    st->pos = S;
  }

  // A packed prefill (every state fresh): the q / q_a / q_b / kv_a projections, norms, indexer keys,
  // output gate and o_proj once over all rows, RoPE varlen (each document from position 0), each
  // document's cache rows appended to its own cache. DSA: each document's Top-K from its own keys
  // (per document, as forward()), the selections packed. Attention in the form forward() takes
  // for each document: explicit -> the kv_b expansion of all rows at once and one varlen
  // attention call; absorbed (at pos0 = 0 only for dims with 2R < nope + vd) -> per document.
  // Equal to forward() per document, bitwise on the CPU (every op there is per row, the
  // indexer and the attention per document). One token per document (a decode step):
  // decode_packed. Other states with history (continuations), or a single document: the
  // per-document default.
  void forward_packed(const DTensor& x, const std::vector<int64_t>& cu, const std::vector<MixerState*>& sts,
                      const DTensor& out) const override {
    bool fresh = false;
    const std::vector<AttnCache*> st = packed_caches(cu, sts, x.rows(), "MLA", &fresh);
    if (st.size() > 1 && x.rows() == int64_t(st.size())) {  // one token per document (a batched decode step)
      decode_packed(x, st, out);
      return;
    }
    if (!fresh || st.size() == 1) {  // history, or one document: forward() itself
      Mixer::forward_packed(x, cu, sts, out);
      return;
    }
    const int64_t N = int64_t(cu.size()) - 1, T = x.rows(), Dq = nope_ + rope_dim_;
    DTensor q = be_->act({T, Hl_ * Dq}), q_resid = be_->act({T, q_lora_});
    DTensor c = be_->act({T, R_}), kr = be_->act({T, rope_dim_});
    DTensor ki = indexer_ ? be_->act({T, idx_dim()}) : DTensor{};
    project(x, Positions{0, &cu}, q, q_resid, c, kr, ki);
    DTensor e = be_->act({T, R_ + rope_dim_});  // [T, R + rope]: the cache rows of every document
    store(c, kr, e);
    auto rows = [&](int64_t b) { return std::make_pair(cu[size_t(b)], cu[size_t(b) + 1]); };
    for (int64_t b = 0; b < N; ++b) {
      const auto [r0, r1] = rows(b);
      if (r1 > r0) {
        be_->copy_rows(e, r0, st[size_t(b)]->latent.append(r1 - r0), 0, r1 - r0);
        if (indexer_) be_->copy_rows(ki, r0, st[size_t(b)]->index_k.append(r1 - r0), 0, r1 - r0);
      }
      st[size_t(b)]->pos = r1 - r0;
    }

    DTensor sel;  // [T, topk]: document b's rows hold positions within document b
    const int64_t K = sel_k_;
    if (K > 0) {
      sel = be_->alloc({T, K}, DType::I32);
      for (int64_t b = 0; b < N; ++b) {
        const auto [r0, r1] = rows(b);
        AttnCache& s = *st[size_t(b)];
        const DTensor sb = sel.slab(r0, r1);
        if (r1 > r0) select_topk(x.slab(r0, r1), q_resid.slab(r0, r1), 0, s.index_k.all(), sb);
        s.topk_width = K;
        s.last_sel = {sb};
        s.sel_be = be_;
      }
    }
    DTensor o = be_->act({T, Hl_ * vd_});  // [T, Hl, vd]
    bool any_absorbed = false;
    for (int64_t b = 0; b < N; ++b) {
      const auto [r0, r1] = rows(b);
      any_absorbed = any_absorbed || (r1 > r0 && use_absorbed(r1 - r0, 0, K));
    }
    if (!any_absorbed) {
      if (T > 0) attend_expanded(e, q, 0, sel, o, cu);
    } else {
      for (int64_t b = 0; b < N; ++b) {
        const auto [r0, r1] = rows(b);
        if (r1 == r0) continue;
        DTensor ob = o.slab(r0, r1);
        attend(*st[size_t(b)], r1 - r0, q.slab(r0, r1), 0, K > 0 ? sel.slab(r0, r1) : DTensor{}, ob);
      }
    }
    finish(x, o, out);
  }

  // One token of each of N documents: the projections, norms, output gate and o_proj once over the
  // N rows; RoPE and the indexer keys at each row's own position; per document the cache appends,
  // the Top-K and the attention (the form forward() takes for one query). Equal to forward() per
  // document (bitwise on the CPU: every op there is per row).
  void decode_packed(const DTensor& x, const std::vector<AttnCache*>& st, const DTensor& out) const {
    const int64_t N = x.rows(), Dq = nope_ + rope_dim_;
    std::vector<int64_t> pos(static_cast<size_t>(N));
    for (int64_t b = 0; b < N; ++b) {
      const AttnCache& s = *st[size_t(b)];
      pos[size_t(b)] = s.pos;
      DZ_CHECK(s.latent.rows() == s.pos && s.index_k.rows() == (indexer_ ? s.pos : 0),
               "MLA mixer: cache size does not match position ", s.pos);
    }
    DTensor q = be_->act({N, Hl_ * Dq}), q_resid = be_->act({N, q_lora_});
    DTensor c = be_->act({N, R_}), kr = be_->act({N, rope_dim_});
    DTensor ki = indexer_ ? be_->act({N, idx_dim()}) : DTensor{};
    project(x, Positions{0, nullptr, &pos}, q, q_resid, c, kr, ki);
    DTensor e = be_->act({N, R_ + rope_dim_});
    store(c, kr, e);
    const int64_t K = sel_k_;
    DTensor sel = K > 0 ? be_->alloc({N, K}, DType::I32) : DTensor{};
    DTensor o = be_->act({N, Hl_ * vd_});  // [N, Hl, vd]
    for (int64_t b = 0; b < N; ++b) {
      AttnCache& s = *st[size_t(b)];
      const int64_t p = pos[size_t(b)];
      be_->copy_rows(e, b, s.latent.append(1), 0, 1);
      DTensor sb;
      if (indexer_) be_->copy_rows(ki, b, s.index_k.append(1), 0, 1);
      if (K > 0) {
        sb = sel.slab(b, b + 1);
        s.topk_width = K;
        select_topk(x.slab(b, b + 1), q_resid.slab(b, b + 1), p, s.index_k.all(), sb);
        s.last_sel = {sb};
        s.sel_be = be_;
      }
      DTensor ob = o.slab(b, b + 1);
      attend(s, p + 1, q.slab(b, b + 1), p, sb, ob);
      s.pos = p + 1;
    }
    finish(x, o, out);
  }

  void forward_cp(const DTensor& x, const CpCtx& ctx, MixerState& st_base, const DTensor& out) const override {
    auto* st = dynamic_cast<AttnCache*>(&st_base);
    DZ_CHECK(st, "MLA mixer: state is not an attention cache");
    DZ_CHECK(st->pos == 0 && st->latent.rows() == 0, "MLA forward_cp: the state must be fresh (pos ", st->pos, ")");
    DZ_CHECK(ctx.cp && ctx.lay, "MLA forward_cp: missing CP group or layout");
    const SeqLayout& lay = *ctx.lay;
    DZ_CHECK(lay.cp_size == ctx.cp->size() && lay.cp_rank == ctx.cp->rank(), "MLA forward_cp: layout for rank ",
             lay.cp_rank, " of ", lay.cp_size, " used on rank ", ctx.cp->rank(), " of ", ctx.cp->size());
    const int64_t L = lay.length, Rl = lay.local_rows(), Dq = nope_ + rope_dim_, Di = idx_dim();
    const int64_t W = R_ + rope_dim_ + Di;  // one token's cache entry: latent | k_pe | indexer key
    const std::vector<int> segs = lay.local_segments();

    // 1. Local cache entries, each segment at its global positions, started to every CP rank.
    DTensor pack = be_->act({Rl, W});  // [latent | k_pe | indexer key] per local row
    std::unique_ptr<PendingRows> gather;
    {
      DTensor c = be_->act({Rl, R_}), kr = be_->act({Rl, rope_dim_});
      DTensor ki = be_->act({Rl, Di});
      lay.each_local_segment([&](int64_t r, int64_t T, int64_t pos0) {
        project_kv(x.slab(r, r + T), Positions{pos0, nullptr}, c.slab(r, r + T), kr.slab(r, r + T),
                   indexer_ ? ki.slab(r, r + T) : DTensor{});
      });
      be_->copy_cols(c, 0, pack, 0, R_);
      be_->copy_cols(kr, 0, pack, R_, rope_dim_);
      if (Di > 0) be_->copy_cols(ki, 0, pack, R_ + rope_dim_, Di);
      gather = cp_gather_seq_start(*be_, ctx, pack);  // on the backend's buffers
    }
    // 2. The local queries while the entries travel (a transport that overlaps: the CPU's MPI).
    DTensor q = be_->act({Rl, Hl_ * Dq}), q_resid = be_->act({Rl, q_lora_});
    lay.each_local_segment([&](int64_t r, int64_t T, int64_t pos0) {
      project_q(x.slab(r, r + T), Positions{pos0, nullptr}, q.slab(r, r + T), q_resid.slab(r, r + T));
    });
    {
      auto tm = ctx.time("kv_gather");  // what is left of the exchange after the queries
      const DTensor full = gather->wait();  // [L, W] in sequence order
      const int64_t Wl = R_ + rope_dim_;    // a latent cache row: [c | kr]
      be_->copy_cols(full, 0, st->latent.append(L), 0, Wl);
      if (indexer_) be_->copy_cols(full, Wl, st->index_k.append(L), 0, Di);
      st->pos = L;
    }

    // 3. Indexer and attention for the local queries only.
    const int64_t K = sel_k_;
    st->topk_width = K;
    st->last_sel.clear();  // local rows, in layout order
    st->sel_be = be_;
    DTensor o = be_->act({Rl, Hl_ * vd_});
    int64_t r = 0;
    for (int j : segs) {
      const int64_t T = lay.seg_len(j), pos0 = lay.seg_begin(j);
      if (T == 0) continue;
      DTensor sel;
      if (K > 0) {
        auto tm = ctx.time("indexer");
        sel = be_->alloc({T, K}, DType::I32);
        ctx.flops("indexer", select_topk(x.slab(r, r + T), q_resid.slab(r, r + T), pos0, st->index_k.all(), sel));
        st->last_sel.push_back(sel);
      }
      {
        auto tm = ctx.time("attention");
        DTensor os = o.slab(r, r + T);
        // The form the serial prefill of the whole document takes, so CP equals one rank (bitwise
        // on the CPU): explicit by FLOPs (use_absorbed would pick the absorbed one only for tiny
        // segments), absorbed for a selection on a fused latent kernel (sparse_absorbed).
        if (sparse_absorbed(K))
          attend_absorbed(*st, pos0 + T, q.slab(r, r + T), pos0, sel, os);
        else
          attend_explicit(*st, pos0 + T, q.slab(r, r + T), pos0, sel, os);
        ctx.flops("attention", attention_flops(pos0, T, K));
      }
      r += T;
    }
    finish(x, o, out);
  }

 private:
  int64_t idx_dim() const { return indexer_ ? indexer_->cache_width() : 0; }

  // Positions of a forward's rows: pos0 .. (one document), or with cu each packed document's
  // rows from 0 (Backend::rope_varlen).
  // Where the rows are: pos0 .. (one document), documents packed from 0 (cu), or one row per
  // document at its own position (row_pos, a decode step).
  struct Positions {
    int64_t pos0 = 0;
    const std::vector<int64_t>* cu = nullptr;
    const std::vector<int64_t>* row_pos = nullptr;
  };
  void rotate(const DTensor& t, int64_t H, int64_t hs, int64_t offset, const Positions& p) const {
    if (p.row_pos) {
      be_->rope_rows(*rope_, t, H, hs, offset, *p.row_pos);
    } else if (p.cu) {
      be_->rope_varlen(*rope_, t, H, hs, offset, *p.cu);
    } else {
      be_->rope(*rope_, t, H, hs, offset, p.pos0);
    }
  }
  void project(const DTensor& x, int64_t pos0, const DTensor& q, const DTensor& q_resid, const DTensor& c,
               const DTensor& kr, const DTensor& ki) const {
    project(x, Positions{pos0, nullptr}, q, q_resid, c, kr, ki);
  }
  // Rows x [T, D] at positions p -> q [T, Hl*Dq] (rope part rotated), q_resid
  // [T, q_lora] (the indexer's input; untouched without q_lora), the cache entries c [T, R]
  // (after kv_a_layernorm), kr [T, rope] (rotated) and the indexer keys ki [T, Di].
  void project(const DTensor& x, const Positions& p, const DTensor& q, const DTensor& q_resid, const DTensor& c,
               const DTensor& kr, const DTensor& ki) const {
    project_q(x, p, q, q_resid);
    project_kv(x, p, c, kr, ki);
  }
  // The queries' half of project (forward_cp runs it while the cache entries travel).
  void project_q(const DTensor& x, const Positions& p, const DTensor& q, const DTensor& q_resid) const {
    if (x.rows() == 0) return;
    Backend& be = *be_;
    if (q_lora_ > 0) {
      be.linear(x, q_a_, q_a_bias_, q_resid);
      be.rmsnorm(q_resid, q_a_norm_, q_resid, latent_eps_, false);
      be.linear(q_resid, q_b_, DTensor{}, q);
    } else {
      be.linear(x, q_, DTensor{}, q);
    }
    if (rope_) rotate(q, Hl_, nope_ + rope_dim_, nope_, p);
  }
  // The cache entries' half: c, kr and the indexer keys ki.
  void project_kv(const DTensor& x, const Positions& p, const DTensor& c, const DTensor& kr, const DTensor& ki) const {
    const int64_t T = x.rows();
    if (T == 0) return;
    Backend& be = *be_;
    DTensor kv = be.act({T, R_ + rope_dim_});  // [T, R + rope]
    be.linear(x, kv_a_, kv_a_bias_, kv);
    be.copy_cols(kv, 0, c, 0, R_);
    be.copy_cols(kv, R_, kr, 0, rope_dim_);
    be.rmsnorm(c, kv_a_norm_, c, latent_eps_, false);
    if (rope_) rotate(kr, 1, rope_dim_, 0, p);
    if (kv_fp8_) {  // --kv-cache fp8: what the cache would hold (latent per 128-tile FP8, RoPE part BF16)
      be.quant_round(c, Backend::Round::KvFp8);
      be.quant_round(kr, Backend::Round::Bf16);
    }
    if (indexer_) {
      if (p.row_pos) {
        indexer_->keys_rows(x, *p.row_pos, ki);
      } else if (p.cu) {
        indexer_->keys(x, *p.cu, ki);
      } else {
        indexer_->keys(x, p.pos0, ki);
      }
    }
  }

  // c [T, R], kr [T, rope] -> the cache rows e [T, R + rope].
  void store(const DTensor& c, const DTensor& kr, const DTensor& e) const {
    be_->copy_cols(c, 0, e, 0, R_);
    if (rope_dim_) be_->copy_cols(kr, 0, e, R_, rope_dim_);
  }

  // Whether T queries at pos0 .. (attending min(K, p + 1) keys each with a DSA selection of K,
  // else p + 1) need fewer FLOPs in the absorbed form than in the explicit one. Per head and
  // attended key the explicit form does q·k over nope + rope and p·v over vd, the absorbed one
  // over R + rope and R; the explicit form expands all S = pos0 + T cached tokens through kv_b
  // ((nope + vd) x R), the absorbed one folds W_uk into the T queries and W_uv into their outputs
  // (the same (nope + vd) x R per query).
  // With a DSA selection on a backend whose latent attention is one fused kernel (cuda's
  // sparse_mla), always absorbed: there one gathered latent row serves every head on tensor cores,
  // while the explicit form gathers each head's own keys and values (Hl times the bytes) in a
  // kernel without them (GLM-5.3-Flash, T = 8192: 1290 ms explicit on the H200).
  bool use_absorbed(int64_t T, int64_t pos0, int64_t K) const {
    if (sparse_absorbed(K)) return true;
    const double S = double(pos0 + T), expand = double(nope_ + vd_) * double(R_), keys = attended_keys(pos0, T, K);
    const double explicit_flops = S * expand + keys * double(nope_ + rope_dim_ + vd_);
    const double absorbed_flops = double(T) * expand + keys * double(2 * R_ + rope_dim_);
    return absorbed_flops < explicit_flops;
  }

  bool sparse_absorbed(int64_t K) const { return K > 0 && be_->mla_latent_fused(R_, rope_dim_); }

  // Attention of q [T, Hl*Dq] at pos0 .. over the first S cache rows -> o [T, Hl*vd], in the form
  // use_absorbed picks.
  void attend(const AttnCache& st, int64_t S, const DTensor& q, int64_t pos0, const DTensor& sel, DTensor& o) const {
    const int64_t T = q.rows();
    if (use_absorbed(T, pos0, sel.defined() ? sel.cols() : 0))
      attend_absorbed(st, S, q, pos0, sel, o);
    else
      attend_explicit(st, S, q, pos0, sel, o);
  }

  // Absorbed: q_lat [T, Hl, R + rope] = [W_uk[h]^T q_nope, q_pe], attention on the cache rows
  // (one KV head) -> o_lat [T, Hl, R], o[h] = W_uv[h] o_lat[h]. kv_b_proj rows per head are
  // W_uk [nope, R] then W_uv [vd, R].
  void attend_absorbed(const AttnCache& st, int64_t S, const DTensor& q, int64_t pos0, const DTensor& sel,
                       DTensor& o) const {
    Backend& be = *be_;
    const int64_t T = q.rows(), Dq = nope_ + rope_dim_, Dl = R_ + rope_dim_, hs = (nope_ + vd_) * R_;
    DTensor ql = be.act({T, Hl_ * Dl});  // [T, Hl, R + rope]
    be.head_matmul(q, Dq, nope_, kv_b_abs_, 0, hs, false, ql, Dl, R_, Hl_);
    if (rope_dim_) be.copy_cols(q.reshaped({T * Hl_, Dq}), nope_, ql.reshaped({T * Hl_, Dl}), R_, rope_dim_);
    DTensor ol = be.act({T, Hl_ * R_});  // [T, Hl, R]
    be.mla_latent_attention(ql, st.latent.view(0, S), sel, pos0, Hl_, R_, rope_dim_, scale_, ol);
    be.head_matmul(ol, R_, R_, kv_b_abs_, nope_ * R_, hs, true, o, vd_, vd_, Hl_);
  }

  // Explicit: keys k [S, Hl, Dq] and values v [S, Hl, vd] of this rank's heads expanded from the
  // latent.
  void attend_explicit(const AttnCache& st, int64_t S, const DTensor& q, int64_t pos0, const DTensor& sel,
                       DTensor& o) const {
    attend_expanded(st.latent.view(0, S), q, pos0, sel, o, {});
  }
  // The same from cache rows [S, R + rope]: one document's first S, or (cu: varlen offsets, pos0 0)
  // the packed documents' rows, expanded at once and attended in one varlen call.
  void attend_expanded(const DTensor& cache, const DTensor& q, int64_t pos0, const DTensor& sel, DTensor& o,
                       const std::vector<int64_t>& cu) const {
    Backend& be = *be_;
    const int64_t Dq = nope_ + rope_dim_, w = nope_ + vd_, S = cache.rows();
    DTensor c = be.act({S, R_});
    be.copy_cols(cache, 0, c, 0, R_);
    DTensor kvb = be.act({S, Hl_ * w});  // [S, Hl, nope + vd]
    be.linear(c, kv_b_, DTensor{}, kvb);
    DTensor k = be.act({S, Hl_ * Dq}), v = be.act({S, Hl_ * vd_});
    for (int64_t h = 0; h < Hl_; ++h) {
      be.copy_cols(kvb, h * w, k, h * Dq, nope_);
      if (rope_dim_) be.copy_cols(cache, R_, k, h * Dq + nope_, rope_dim_);
      be.copy_cols(kvb, h * w + nope_, v, h * vd_, vd_);
    }
    AttnArgs a;
    a.cu = cu;
    a.q = q;
    a.k = k;
    a.v = v;
    a.out = o;
    a.sel = sel;
    a.pos0 = pos0;
    a.Hq = Hl_;
    a.Hkv = Hl_;
    a.Dk = Dq;
    a.Dv = vd_;
    a.scale = scale_;
    be.attention(a);
  }

  // DSA Top-K sel [T, topk] for queries x / q_resid [T, ..] at pos0 .. pos0+T-1 over index_k. The
  // indexer is replicated over TP; with enough rows (>= kSplitRows per TP rank) the query rows are
  // split into TP-rank blocks, each rank scores its block and the int32 Top-K rows are
  // all-gathered, so scoring scales with TP at the cost of T × topk × 4 bytes
  // (docs/parallel_attention.md). Either way every rank ends with the same, serial-identical
  // sets. Returns the scoring FLOPs done by this rank.
  static constexpr int64_t kSplitRows = 8;
  // A shared-indexer layer (no indexer_) takes the sets its writer made for the same rows instead.
  double select_topk(const DTensor& x, const DTensor& q_resid, int64_t pos0, const DTensor& index_k,
                     const DTensor& sel) const {
    if (!indexer_) {
      topk_.take->take(topk_.reader, sel, *be_);
      return 0;
    }
    const double fl = select_own(x, q_resid, pos0, index_k, sel);
    if (topk_.publish) topk_.publish->put(sel);
    return fl;
  }
  double select_own(const DTensor& x, const DTensor& q_resid, int64_t pos0, const DTensor& index_k,
                    const DTensor& sel) const {
    const int64_t K = indexer_->topk(), T = x.rows();
    const bool split = tp_.size > 1 && tp_.comm && tp_.comm->size() == tp_.size && T >= kSplitRows * tp_.size;
    if (!split) {
      indexer_->select(x, q_resid, pos0, index_k, sel);
      return indexer_flops(pos0, T);
    }
    const auto [a, b] = tp_.range_uneven(T);  // this rank's query rows, blocks in TP-rank order
    DTensor mine = be_->alloc({b - a, K}, DType::I32);
    indexer_->select(x.slab(a, b), q_resid.slab(a, b), pos0 + a, index_k, mine);
    std::vector<int32_t> h(size_t((b - a) * K));
    if (b > a) be_->download_i32(mine, h.data());
    const std::vector<int32_t> all = tp_.comm->allgatherv(h);
    DZ_CHECK(int64_t(all.size()) == T * K, "MLA indexer: gathered ", all.size(), " Top-K entries, expected ", T * K);
    const DTensor up = be_->upload_i32(all.data(), {T, K});
    be_->copy_rows(up, 0, sel, 0, T);
    return indexer_flops(pos0 + a, b - a);
  }

  // o [T, Hl*vd] -> out [T, D]: output gate, o_proj over this rank's heads, TP all-reduce.
  void finish(const DTensor& x, DTensor& o, const DTensor& out) const {
    const int64_t T = x.rows();
    if (T > 0) {
      if (g_.defined()) {
        DTensor g = be_->act({T, Hl_ * vd_});  // [T, Hl*vd]
        be_->linear(x, g_, DTensor{}, g);
        be_->mul_sigmoid(o, g);
      }
      be_->linear(o, o_, o_bias_, out);
    }
    tp_.allreduce(*be_, out);
  }

  // Work of T queries at pos0 .. pos0+T-1 (query at p sees p + 1 keys):
  //   indexer: visible keys × index heads × index_head_dim × 2 (the dense causal score matrix);
  //   attention: attended keys (min(topk, p + 1) with DSA, else p + 1) × local heads × (Dq + vd) × 2.
  // Keys attended by T queries at pos0 .. pos0+T-1: min(K, p + 1) each with a DSA selection of K
  // (K > 0), else p + 1 (exact in double for any realistic T, pos0).
  static double attended_keys(int64_t pos0, int64_t T, int64_t K) {
    if (K <= 0) return double(T) * double(pos0) + double(T) * double(T + 1) / 2;
    double keys = 0;
    for (int64_t p = pos0; p < pos0 + T; ++p) keys += double(std::min(K, p + 1));
    return keys;
  }
  double indexer_flops(int64_t pos0, int64_t T) const {
    return attended_keys(pos0, T, 0) * double(indexer_->n_heads()) * double(indexer_->head_dim()) * 2;
  }
  double attention_flops(int64_t pos0, int64_t T, int64_t K) const {
    return attended_keys(pos0, T, K) * double(Hl_) * double(nope_ + rope_dim_ + vd_) * 2;
  }

  int64_t D_ = 0, H_ = 0, Hl_ = 0, q_lora_ = 0, R_ = 0, nope_ = 0, rope_dim_ = 0, vd_ = 0;
  float scale_ = 1.f;
  float latent_eps_ = 1e-6f;  // q_a / kv_a RMSNorm eps (DeepSeek 1e-6; GLM-5.3-Flash rms_norm_eps)
  bool kv_fp8_ = false;  // --kv-cache fp8
  TpShard tp_;                          // size 1 unless loaded sharded
  Backend* be_;
  DTensor q_;                            // [Hl*Dq, D]        (q_lora_rank == 0)
  DTensor q_a_, q_a_bias_, q_a_norm_;    // [q_lora, D], [q_lora], [q_lora]
  DTensor q_b_;                          // [Hl*Dq, q_lora]
  DTensor kv_a_, kv_a_bias_, kv_a_norm_; // [R + rope, D], [R + rope], [R]
  DTensor kv_b_;                         // [Hl*(nope + vd), R]
  DTensor kv_b_abs_;                     // the same in weight_dtype() (kv_b_ itself unless FP8)
  DTensor o_, o_bias_;                   // [D, Hl*vd], [D] (bias on TP rank 0 only)
  DTensor g_;                            // [Hl*vd, D]        (output gate)
  Tensor hq_, hq_a_, hq_a_bias_, hq_a_norm_, hq_b_, hkv_a_, hkv_a_bias_, hkv_a_norm_, hkv_b_, ho_, ho_bias_, hg_;  // as loaded
  std::unique_ptr<Rope> rope_;          // null: NoPE
  std::unique_ptr<DsaIndexer> indexer_; // null: dense, or a shared-indexer layer
  int64_t sel_k_ = 0;                   // Top-K width of the sparse attention (0: dense)
  TopkLink topk_;                       // GLM-5 cross-layer Top-K sharing
};

}  // namespace

std::shared_ptr<TopkShare> make_topk_share() { return std::make_shared<TopkShare>(); }

std::unique_ptr<Mixer> make_mla_mixer_linked(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                             const TpShard& tp, Backend& be, const TopkLink& topk) {
  return std::make_unique<MlaMixer>(cfg, layer, ck, prefix, tp, be, topk);
}

std::unique_ptr<Mixer> make_mla_mixer(const ModelConfig& cfg, int layer, Checkpoint& ck, const std::string& prefix,
                                      const TpShard& tp, Backend& be) {
  return std::make_unique<MlaMixer>(cfg, layer, ck, prefix, tp, be, TopkLink{});
}

}  // namespace dz
