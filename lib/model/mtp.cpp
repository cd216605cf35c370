#include "model/mtp.hpp"

#include "core/error.hpp"
#include "core/log.hpp"
#include "model/model.hpp"

namespace dz {

bool mtp_supported(const ModelConfig& cfg) {
  return (cfg.family == Family::DeepseekV32 || cfg.family == Family::Qwen3Next) && cfg.hc_mult == 0 &&
         cfg.attn_res_block_size == 0;
}

std::unique_ptr<MtpLayer> make_mtp_layer(const ModelConfig& cfg, Checkpoint& ck, const TpShard& tp, Backend& be) {
  DZ_CHECK(cfg.mtp_layers > 0, "--speculative mtp: ", cfg.model_type,
           ": config.json declares no MTP layers (num_nextn_predict_layers / mtp_num_hidden_layers); "
           "use --speculative ngram");
  const bool deepseek = cfg.family == Family::DeepseekV32, qwen = cfg.family == Family::Qwen3Next;
  DZ_CHECK(mtp_supported(cfg), "--speculative mtp: ",
           cfg.model_type, ": drafts from its MTP layer are not built (DeepSeek-V3.2 / GLM-5 and Qwen3-Next / "
           "Qwen3.5 are); use --speculative ngram");
  DZ_CHECK(!cfg.layers.empty(), "MTP: a model without layers");
  auto m = std::make_unique<MtpLayer>();
  m->cfg = cfg;
  m->layer = int(cfg.num_layers);
  m->carry_normed = qwen;
  m->mask_first = deepseek;
  LayerSpec ls;
  ls.ffn = cfg.layers.back().ffn;  // the last layer's kind (MoE in every published MTP layer)
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
  DZ_CHECK(hidden.rows() == R && hidden.cols() == D, "MTP: ", hidden.rows(), " hidden rows for ", R, " tokens");
  for (int64_t r = 0; r < R; ++r)
    DZ_CHECK(next_tokens[r] >= 0 && next_tokens[r] < cfg.vocab_size, "MTP: token id ", next_tokens[r],
             " outside the vocabulary of ", cfg.vocab_size);
  DTensor h = be.alloc({R, D}, DType::F32);  // the block's residual stream
  be.embed(embed, be.upload_i32(next_tokens, {R}), h);
  DTensor cat = be.act({R, 2 * D});  // [enorm(emb) | hnorm(hidden)]
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

}  // namespace dz

// ---- the model's side: the MTP layer one position behind, and the drafts ----
namespace dz {

void Model::mtp_extend(const int32_t* tokens, const std::vector<int64_t>& cu, const DTensor& hidden,
                       const std::vector<State*>& states, DTensor* out) const {
  DZ_CHECK(mtp_, "mtp_extend: the model was loaded without its MTP layer");
  Backend& be = *be_;
  const size_t B = states.size();
  const int64_t D = cfg_.hidden_size;
  DZ_CHECK(cu.size() == B + 1 && cu[0] == 0 && hidden.rows() == cu[B] && hidden.cols() == D, "mtp_extend: ", B,
           " states, ", cu.size(), " offsets, hidden ", shape_str(hidden.shape));
  int64_t total = 0;
  for (size_t b = 0; b < B; ++b) {
    DZ_CHECK(cu[b + 1] > cu[b], "mtp_extend: document ", b, " has no rows");
    DZ_CHECK(states[b] && states[b]->mtp, "mtp_extend: a state made without the MTP layer");
    total += cu[b + 1] - cu[b] - 1 + (states[b]->mtp_pending.defined() ? 1 : 0);
  }
  DTensor x = be.act({total, D});  // [the pending row; every row but the last] per document
  std::vector<int32_t> next;
  std::vector<int64_t> mcu{0};
  std::vector<MixerState*> ms;
  int64_t r = 0;
  for (size_t b = 0; b < B; ++b) {
    State& st = *states[b];
    const int64_t n = cu[b + 1] - cu[b], r0 = r;
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
    if (r > r0) mcu.push_back(r), ms.push_back(st.mtp.get());
  }
  if (total == 0) {
    if (out) *out = be.act({0, D});
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
  const int64_t D = cfg_.hidden_size, V = cfg_.vocab_size;
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
  // Row 0 (the pending row with the chosen token) stays; the chained rows are undone at the end.
  for (size_t b : docs) mtp_->mixer->spec_begin(*states[b]->mtp, SpecRestore::Replay);
  DTensor carry;
  std::vector<size_t> prev;  // the documents of carry's rows
  for (int64_t j = 0;; ++j) {
    std::vector<size_t> now;
    for (size_t b : (j == 0 ? docs : prev))
      if (k[b] > j) now.push_back(b);
    if (now.empty()) break;
    const int64_t n = int64_t(now.size());
    DTensor x = be.act({n, D});
    std::vector<int32_t> next(static_cast<size_t>(n));
    std::vector<int64_t> cu(static_cast<size_t>(n + 1));
    std::vector<MixerState*> ms(static_cast<size_t>(n));
    for (int64_t i = 0, pi = 0; i < n; ++i) {
      const size_t b = now[size_t(i)];
      if (j == 0) {
        be.copy_rows(states[b]->mtp_pending, 0, x, i, 1);
        next[size_t(i)] = cur[b];
      } else {
        while (prev[size_t(pi)] != b) ++pi;  // now is a subsequence of prev
        be.copy_rows(carry, pi, x, i, 1);
        next[size_t(i)] = drafts[b].back();
      }
      cu[size_t(i + 1)] = i + 1;
      ms[size_t(i)] = states[b]->mtp.get();
    }
    const MtpLayer::Out o = mtp_->forward(be, embed_, next.data(), x, cu, ms);
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
  for (size_t b : docs) mtp_->mixer->spec_keep(*states[b]->mtp, 1);
  return drafts;
}

}  // namespace dz
