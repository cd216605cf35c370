#include "model/mtp.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "model/model.hpp"

namespace dz {

bool mtp_supported(const ModelConfig& cfg) {
  if (cfg.family == Family::DeepseekV4) return cfg.hc_mult > 0 && cfg.hc_head_weighted;
  return (cfg.family == Family::DeepseekV32 || cfg.family == Family::Qwen3Next) && cfg.hc_mult == 0 &&
         cfg.attn_res_block_size == 0;
}

namespace {

// DeepSeek-V4's MTP layer (mtp.0.*, DeepSeek's own names as its main layers').
void build_v4(MtpLayer& m, const ModelConfig& cfg, Checkpoint& ck, const TpShard& tp, Backend& be) {
  const int64_t D = cfg.hidden_size, V = cfg.vocab_size, N = cfg.hc_mult;
  const ModelConfig& c = m.cfg;
  const std::string p = "mtp.0.";
  auto param = [&](const Tensor& t) { return t.empty() ? DTensor{} : be.param(t); };
  auto weight = [&](const Tensor& t) { return t.empty() ? DTensor{} : be.weight(t); };
  m.mask_first = true;  // vLLM's deepseek_v4_mtp as its deepseek_mtp
  m.streams_in = true;
  m.hp.N = N, m.hp.iters = int(cfg.hc_sinkhorn_iters), m.hp.eps_norm = cfg.rms_norm_eps, m.hp.eps_hc = cfg.hc_eps;
  m.enorm = param(ck.get(p + "enorm.weight", {D}, Init::ones()));
  m.hnorm = param(ck.get(p + "hnorm.weight", {D}, Init::ones()));
  m.e_proj = weight(ck.get(p + "e_proj.weight", {D, D}, Init::normal(0.02f)));
  m.h_proj = weight(ck.get(p + "h_proj.weight", {D, D}, Init::normal(0.02f)));
  m.norm = param(ck.get(p + "norm.weight", {D}, Init::ones()));
  m.attn_norm = param(ck.get(p + "attn_norm.weight", {D}, Init::ones()));
  m.ffn_norm = param(ck.get(p + "ffn_norm.weight", {D}, Init::ones()));
  for (int w = 0; w < 2; ++w) {
    const HcTensors t = get_hc_tensors(c, ck, p, w);
    m.hc_fn[w] = param(t.fn), m.hc_base[w] = param(t.base), m.hc_scale[w] = param(t.scale);
  }
  const HcHead h = upload_hc_head(ck.get(p + "hc_head_fn", {N, N * D}, Init::normal(0.02f)),
                                  ck.get(p + "hc_head_base", {N}, Init::zeros()),
                                  ck.get(p + "hc_head_scale", {1}, Init::ones()), N, D, be);
  m.head_fn = h.fn, m.head_base = h.base, m.head_scale = h.scale;
  m.mixer = make_dsv4_mixer(c, m.layer, ck, p, tp, be);
  m.ffn = make_moe_ffn(c, m.layer, ck, p, tp, be);
  if (ck.keeps_full()) {  // the copies of the embedding and the head: written by make-model, never read
    ck.get(p + "emb.tok_emb.weight", {V, D}, Init::normal(1.0f));
    ck.get(p + "head.weight", {V, D}, Init::normal(0.02f));
  }
}

}  // namespace

std::unique_ptr<MtpLayer> make_mtp_layer(const ModelConfig& cfg, Checkpoint& ck, const TpShard& tp, Backend& be) {
  DZ_CHECK(cfg.mtp_layers > 0, "--speculative mtp: ", cfg.model_type,
           ": config.json declares no MTP layers (num_nextn_predict_layers / mtp_num_hidden_layers); "
           "use --speculative ngram");
  const bool deepseek = cfg.family == Family::DeepseekV32, qwen = cfg.family == Family::Qwen3Next;
  DZ_CHECK(mtp_supported(cfg), "--speculative mtp: ",
           cfg.model_type, ": drafts from its MTP layer are not built (DeepSeek-V3.2 / GLM-5, Qwen3-Next / "
           "Qwen3.5 and DeepSeek-V4 are); use --speculative ngram");
  DZ_CHECK(!cfg.layers.empty(), "MTP: a model without layers");
  auto m = std::make_unique<MtpLayer>();
  m->cfg = cfg;
  m->layer = int(cfg.num_layers);
  m->carry_normed = qwen;
  m->mask_first = deepseek;
  LayerSpec ls;
  ls.ffn = cfg.layers.back().ffn;  // the last layer's kind (MoE in every published MTP layer)
  if (cfg.family == Family::DeepseekV4) {
    ls.mixer = MixerKind::DSV4;
    ls.compress_rate = cfg.mtp_compress_rate;
    ls.has_indexer = cfg.mtp_csa;
    ls.ffn = FfnKind::MoE;  // past the hash-routed layers
    m->cfg.layers.push_back(ls);
    build_v4(*m, cfg, ck, tp, be);
    return m;
  }
  if (deepseek) {
    ls.mixer = MixerKind::MLA;
    for (const LayerSpec& l : cfg.layers) ls.has_indexer |= l.has_indexer;  // its own indexer, never shared
  } else {
    ls.mixer = MixerKind::GQA;
  }
  m->cfg.layers.push_back(ls);
  const ModelConfig& c = m->cfg;  // what the block's modules keep reading
  const int64_t D = cfg.hidden_size, V = cfg.vocab_size;
  const Init norm_init = cfg.norm_zero_centered ? Init::zeros() : Init::ones();
  auto param = [&](const Tensor& t) { return t.empty() ? DTensor{} : be.param(t); };
  auto weight = [&](const Tensor& t) { return t.empty() ? DTensor{} : be.weight(t); };
  const std::string p = deepseek ? str("model.layers.", cfg.num_layers, ".") : "mtp.layers.0.";
  const std::string q = deepseek ? p : "mtp.";
  m->enorm = param(ck.get(q + (deepseek ? "enorm.weight" : "pre_fc_norm_embedding.weight"), {D}, norm_init));
  m->hnorm = param(ck.get(q + (deepseek ? "hnorm.weight" : "pre_fc_norm_hidden.weight"), {D}, norm_init));
  m->proj = weight(ck.get(q + (deepseek ? "eh_proj.weight" : "fc.weight"), {D, 2 * D}, Init::normal(0.02f)));
  m->norm = param(ck.get(q + (deepseek ? "shared_head.norm.weight" : "norm.weight"), {D}, norm_init));
  m->attn_norm = param(ck.get(p + "input_layernorm.weight", {D}, norm_init));
  m->ffn_norm = param(ck.get(p + "post_attention_layernorm.weight", {D}, norm_init));
  if (deepseek)
    m->mixer = make_mla_mixer_linked(c, m->layer, ck, p, tp, be, TopkLink{});
  else
    m->mixer = make_gqa_mixer(c, m->layer, ck, p, tp, be);
  m->ffn = ls.ffn == FfnKind::MoE ? make_moe_ffn(c, m->layer, ck, p, tp, be) : make_mlp_ffn(c, m->layer, ck, p, tp, be);
  // DeepSeek's MTP layer carries copies of the embedding and the head; the main model's are used.
  // make-model writes them (the published layout); a loaded checkpoint's are accepted by name
  // (skip_mtp_layers), never read.
  if (deepseek && ck.keeps_full()) {
    ck.get(p + "embed_tokens.weight", {V, D}, Init::normal(1.0f));
    ck.get(p + "shared_head.head.weight", {V, D}, Init::normal(0.02f));
  }
  return m;
}

MtpLayer::Out MtpLayer::forward(Backend& be, const DTensor& embed, const int32_t* next_tokens, const DTensor& hidden,
                                const std::vector<int64_t>& cu, const std::vector<MixerState*>& st) const {
  const int64_t R = cu.back(), D = cfg.hidden_size;
  const float eps = cfg.rms_norm_eps;
  const bool zc = cfg.norm_zero_centered;
  const int64_t W = width();
  DZ_CHECK(hidden.rows() == R && hidden.cols() == W, "MTP: hidden ", shape_str(hidden.shape), " for ", R,
           " tokens of width ", W);
  for (int64_t r = 0; r < R; ++r)
    DZ_CHECK(next_tokens[r] >= 0 && next_tokens[r] < cfg.vocab_size, "MTP: token id ", next_tokens[r],
             " outside the vocabulary of ", cfg.vocab_size);
  DTensor h = be.alloc({R, D}, DType::F32);  // the block's residual stream
  be.embed(embed, be.upload_i32(next_tokens, {R}), h);
  DTensor a = be.act({R, D}), b = be.act({R, D});
  be.rmsnorm(h, enorm, a, eps, zc);
  if (mask_first) {
    DTensor zero;
    for (size_t d = 0; d + 1 < cu.size(); ++d)
      if (st[d]->pos == 0 && cu[d + 1] > cu[d]) {
        if (!zero.defined()) zero = be.zeros({1, D}, a.dtype);
        be.copy_rows(zero, 0, a, cu[d], 1);  // enorm(0) = 0
      }
  }
  if (streams_in) return forward_streams(be, a, next_tokens, hidden, cu, st);
  DTensor cat = be.act({R, 2 * D});  // [enorm(emb) | hnorm(hidden)]
  be.rmsnorm(hidden, hnorm, b, eps, zc);
  be.copy_cols(a, 0, cat, 0, D);
  be.copy_cols(b, 0, cat, D, D);
  be.linear(cat, proj, DTensor{}, a);
  be.convert(a, h);
  be.rmsnorm(h, attn_norm, a, eps, zc);
  mixer->forward_packed(a, cu, st, b);
  be.add(h, b);
  be.rmsnorm(h, ffn_norm, a, eps, zc);
  ffn->forward_tokens(a, next_tokens, b);
  be.add(h, b);
  Out o;
  o.normed = be.act({R, D});
  be.rmsnorm(h, norm, o.normed, eps, zc);
  if (carry_normed) {
    o.carry = o.normed;
  } else {
    o.carry = be.act({R, D});
    be.convert(h, o.carry);
  }
  return o;
}

MtpLayer::Out MtpLayer::forward_streams(Backend& be, const DTensor& emb, const int32_t* next_tokens,
                                        const DTensor& hidden, const std::vector<int64_t>& cu,
                                        const std::vector<MixerState*>& st) const {
  const int64_t R = cu.back(), D = cfg.hidden_size, N = hp.N;
  const float eps = cfg.rms_norm_eps;
  DTensor e = be.act({R, D}), ef = be.alloc({R, D}, DType::F32);
  be.linear(emb, e_proj, DTensor{}, e);
  be.convert(e, ef);
  DTensor hn = be.act({R * N, D}), hs = be.act({R * N, D});  // each stream normed, projected
  be.rmsnorm(hidden.reshaped({R * N, D}), hnorm, hn, eps, false);
  be.linear(hn, h_proj, DTensor{}, hs);
  DTensor x = be.alloc({R, N * D}, DType::F32);  // the block's streams
  be.hc_expand(ef, N, x);
  be.add(x, hs.reshaped({R, N * D}));
  DTensor coeff = be.alloc({R, (2 + N) * N}, DType::F32), in = be.alloc({R, D}, DType::F32);
  DTensor a = be.act({R, D}), b = be.act({R, D});
  for (int w = 0; w < 2; ++w) {
    be.hc_pre(x, hc_fn[w], hc_base[w], hc_scale[w], hp, coeff, in);
    be.rmsnorm(in, w == 0 ? attn_norm : ffn_norm, a, eps, false);
    if (w == 0)
      mixer->forward_packed(a, cu, st, b);
    else
      ffn->forward_tokens(a, next_tokens, b);
    be.hc_post(x, coeff, b, N);
  }
  be.hc_pre(x, head_fn, head_base, head_scale, hp, coeff, in);  // the weighted head
  Out o;
  o.normed = be.act({R, D});
  be.rmsnorm(in, norm, o.normed, eps, false);
  o.carry = be.act({R, N * D});
  be.convert(x, o.carry);
  return o;
}

}  // namespace dz

// ---- the model's side: the MTP layer one position behind, and the drafts ----
namespace dz {

namespace {
// Moves st's deferred rows (mtp_extend's defer) into x at row r and their next tokens onto next;
// returns how many.
int64_t take_deferred(Backend& be, Model::State& st, const DTensor& x, int64_t r, std::vector<int32_t>& next) {
  if (!st.mtp_deferred.defined()) return 0;
  const int64_t n = st.mtp_deferred.rows();
  be.copy_rows(st.mtp_deferred, 0, x, r, n);
  next.insert(next.end(), st.mtp_deferred_next.begin(), st.mtp_deferred_next.end());
  st.mtp_deferred = DTensor{}, st.mtp_deferred_next.clear();
  return n;
}
}  // namespace

void Model::mtp_extend(const int32_t* tokens, const std::vector<int64_t>& cu, const DTensor& hidden,
                       const std::vector<State*>& states, DTensor* out, bool defer) const {
  DZ_CHECK(mtp_, "mtp_extend: the model was loaded without its MTP layer");
  DZ_CHECK(!(defer && out), "mtp_extend: deferred rows have no outputs yet");
  Backend& be = *be_;
  const size_t B = states.size();
  const int64_t D = mtp_->width();  // of a row of hidden
  DZ_CHECK(cu.size() == B + 1 && cu[0] == 0 && hidden.rows() == cu[B] && hidden.cols() == D, "mtp_extend: ", B,
           " states, ", cu.size(), " offsets, hidden ", shape_str(hidden.shape), " (rows of width ", D, ")");
  int64_t total = 0;
  for (size_t b = 0; b < B; ++b) {
    DZ_CHECK(cu[b + 1] > cu[b], "mtp_extend: document ", b, " has no rows");
    DZ_CHECK(states[b] && states[b]->mtp, "mtp_extend: a state made without the MTP layer");
    const State& st = *states[b];
    total += int64_t(st.mtp_deferred_next.size()) + (st.mtp_pending.defined() ? 1 : 0) + cu[b + 1] - cu[b] - 1;
  }
  // per document: [rows deferred before; the pending row; every new row but the last]
  DTensor x = be.act({total, D});
  std::vector<int32_t> next;
  std::vector<int64_t> mcu{0};
  std::vector<MixerState*> ms;
  std::vector<State*> mst;
  int64_t r = 0;
  for (size_t b = 0; b < B; ++b) {
    State& st = *states[b];
    const int64_t n = cu[b + 1] - cu[b], r0 = r;
    r += take_deferred(be, st, x, r, next);
    if (st.mtp_pending.defined()) {
      be.copy_rows(st.mtp_pending, 0, x, r++, 1);
      next.push_back(tokens[cu[b]]);
    }
    if (n > 1) {
      be.copy_rows(hidden, cu[b], x, r, n - 1);
      next.insert(next.end(), tokens + cu[b] + 1, tokens + cu[b + 1]);
      r += n - 1;
    }
    st.mtp_pending = be.act({1, D});
    be.copy_rows(hidden, cu[b + 1] - 1, st.mtp_pending, 0, 1);
    if (r > r0) mcu.push_back(r), ms.push_back(st.mtp.get()), mst.push_back(&st);
  }
  if (total == 0) {
    if (out) *out = be.act({0, D});
    return;
  }
  if (defer) {  // each document's rows wait in its state for its next first draft's forward
    for (size_t i = 0; i < mst.size(); ++i) {
      mst[i]->mtp_deferred = x.slab(mcu[i], mcu[i + 1]);
      mst[i]->mtp_deferred_next.assign(next.begin() + mcu[i], next.begin() + mcu[i + 1]);
    }
    return;
  }
  const MtpLayer::Out o = mtp_->forward(be, embed_, next.data(), x, mcu, ms);
  if (out) *out = o.normed;
}

std::vector<std::vector<int32_t>> Model::mtp_draft(const std::vector<int32_t>& cur, const std::vector<State*>& states,
                                                   const std::vector<int64_t>& k, std::vector<float>* first_logits) const {
  DZ_CHECK(mtp_, "mtp_draft: the model was loaded without its MTP layer");
  Backend& be = *be_;
  const size_t B = states.size();
  const int64_t D = mtp_->width(), V = cfg_.vocab_size;
  DZ_CHECK(cur.size() == B && k.size() == B, "mtp_draft: ", B, " states, ", cur.size(), " tokens, ", k.size(), " counts");
  std::vector<std::vector<int32_t>> drafts(B);
  std::vector<size_t> docs;  // the documents of this forward, in order
  for (size_t b = 0; b < B; ++b)
    if (k[b] > 0) {
      DZ_CHECK(states[b] && states[b]->mtp && states[b]->mtp_pending.defined(),
               "mtp_draft: document ", b, " has no pending MTP row (mtp_extend after its prefill?)");
      docs.push_back(b);
    }
  if (docs.empty()) return drafts;
  if (first_logits) first_logits->resize(size_t(int64_t(B) * V));
  // The first forward's rows (deferred ones and the pending row with the chosen token) stay; the
  // chained rows are undone at the end.
  Mixer::Copies copies;
  for (size_t b : docs) mtp_->mixer->spec_begin(*states[b]->mtp, SpecRestore::Replay, &copies);
  be_->copy_rows_many(copies);
  std::vector<int64_t> deferred(B, 0);
  DTensor carry;
  std::vector<size_t> prev;  // the documents of carry's rows
  for (int64_t j = 0;; ++j) {
    std::vector<size_t> now;
    for (size_t b : (j == 0 ? docs : prev))
      if (k[b] > j) now.push_back(b);
    if (now.empty()) break;
    const int64_t n = int64_t(now.size());
    // rows per document: one, and at j = 0 first the rows deferred by mtp_extend (the catch-up)
    std::vector<int64_t> cu{0};
    for (size_t b : now) cu.push_back(cu.back() + 1 + (j == 0 ? int64_t(states[b]->mtp_deferred_next.size()) : 0));
    DTensor x = be.act({cu.back(), D});
    std::vector<int32_t> next;
    std::vector<MixerState*> ms(static_cast<size_t>(n));
    for (int64_t i = 0, pi = 0; i < n; ++i) {
      const size_t b = now[size_t(i)];
      State& st = *states[b];
      if (j == 0) {
        deferred[b] = take_deferred(be, st, x, cu[size_t(i)], next);
        be.copy_rows(st.mtp_pending, 0, x, cu[size_t(i) + 1] - 1, 1);
        next.push_back(cur[b]);
      } else {
        while (prev[size_t(pi)] != b) ++pi;  // now is a subsequence of prev
        be.copy_rows(carry, pi, x, i, 1);
        next.push_back(drafts[b].back());
      }
      ms[size_t(i)] = st.mtp.get();
    }
    MtpLayer::Out o = mtp_->forward(be, embed_, next.data(), x, cu, ms);
    if (cu.back() > n) {  // the drafting rows: each document's last
      MtpLayer::Out last;
      last.normed = be.act({n, o.normed.cols()}), last.carry = be.act({n, o.carry.cols()});
      for (int64_t i = 0; i < n; ++i) {
        be.copy_rows(o.normed, cu[size_t(i) + 1] - 1, last.normed, i, 1);
        be.copy_rows(o.carry, cu[size_t(i) + 1] - 1, last.carry, i, 1);
      }
      o = last;
    }
    std::vector<int32_t> ids(static_cast<size_t>(n));
    head_.greedy(o.normed, ids.data());
    if (j == 0 && first_logits) {
      std::vector<float> lg(static_cast<size_t>(n * V));
      head_.logits_full(o.normed, lg.data());
      for (int64_t i = 0; i < n; ++i)
        std::copy(lg.begin() + i * V, lg.begin() + (i + 1) * V, first_logits->begin() + int64_t(now[size_t(i)]) * V);
    }
    for (int64_t i = 0; i < n; ++i) drafts[now[size_t(i)]].push_back(ids[size_t(i)]);
    if (j == 0)
      for (size_t b : now) states[b]->mtp_pending = DTensor{};
    carry = o.carry;
    prev = now;
  }
  copies.clear();
  for (size_t b : docs) mtp_->mixer->spec_keep(*states[b]->mtp, 1 + deferred[b], &copies);
  be_->copy_rows_many(copies);
  return drafts;
}

}  // namespace dz
