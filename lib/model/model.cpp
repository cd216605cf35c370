#include "model/model.hpp"

#include <cmath>
#include <cstring>

#include "core/linalg.hpp"
#include "model/attn_res.hpp"
#include "ops/norm.hpp"

namespace dz {

Model::~Model() = default;

void skip_mtp_layers(const ModelConfig& cfg, Checkpoint& ck) {
  // DeepSeek checkpoints append multi-token-prediction layers (model.layers.{L..L+n-1}) used only
  // for speculative decoding; dayzero does not run them, so they are accepted by name and skipped.
  const int64_t n = cfg.raw.value("num_nextn_predict_layers", int64_t(0));
  if (n <= 0) return;
  ck.set_dry_run(true);
  for (const auto& name : ck.unused())
    for (int64_t l = cfg.num_layers; l < cfg.num_layers + n; ++l)
      if (name.rfind(str("model.layers.", l, "."), 0) == 0) ck.get(name, ck.info(name).shape);
  ck.set_dry_run(false);
}

std::unique_ptr<Model> Model::load(const std::string& dir, const TpShard& tp, bool kv_cache_fp8, bool index_mxfp8) {
  ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
  cfg.kv_cache_fp8 = kv_cache_fp8;
  cfg.index_mxfp8 = index_mxfp8;
  auto ck = Checkpoint::open(dir);
  auto m = build(cfg, *ck, tp);
  skip_mtp_layers(cfg, *ck);
  ck->check_all_used();
  return m;
}

std::unique_ptr<Model> Model::build(const ModelConfig& cfg, Checkpoint& ck, const TpShard& tp) {
  cfg.validate();
  std::unique_ptr<Model> m(new Model());
  m->cfg_ = cfg;
  const int64_t V = cfg.vocab_size, D = cfg.hidden_size;
  // Zero-centred norms store w with the output scaled by (1 + w): generated weights start at 0.
  const Init norm_init = cfg.norm_zero_centered ? Init::zeros() : Init::ones();
  m->embed_ = ck.get("model.embed_tokens.weight", {V, D}, Init::normal(1.0f));
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string p = str("model.layers.", i, ".");
    const LayerSpec& ls = cfg.layers[size_t(i)];
    Layer L;
    L.attn_norm = ck.get(p + "input_layernorm.weight", {D}, norm_init);
    switch (ls.mixer) {
      case MixerKind::KDA: L.mixer = make_kda_mixer(cfg, int(i), ck, p, tp); break;
      case MixerKind::GDN: L.mixer = make_gdn_mixer(cfg, int(i), ck, p, tp); break;
      case MixerKind::MLA: L.mixer = make_mla_mixer(cfg, int(i), ck, p, tp); break;
      case MixerKind::GQA: L.mixer = make_gqa_mixer(cfg, int(i), ck, p, tp); break;
    }
    L.ffn_norm = ck.get(p + "post_attention_layernorm.weight", {D}, norm_init);
    L.ffn = ls.ffn == FfnKind::MoE ? make_moe_ffn(cfg, int(i), ck, p, tp) : make_mlp_ffn(cfg, int(i), ck, p, tp);
    m->layers_.push_back(std::move(L));
  }
  if (cfg.attn_res_block_size > 0) m->attn_res_ = std::make_unique<AttnRes>(cfg, ck);
  m->final_norm_ = ck.get("model.norm.weight", {D}, norm_init);
  if (cfg.tie_word_embeddings)
    m->head_ = LmHead(m->embed_, V, D, tp);
  else
    m->head_ = LmHead(ck.get("lm_head.weight", {V, D}, Init::normal(0.02f)), V, D, tp);
  return m;
}

Model::State Model::make_state() const {
  State st;
  for (const auto& L : layers_) st.mixers.push_back(L.mixer->make_state());
  return st;
}

Model::State Model::State::clone() const {
  State s;
  s.pos = pos;
  for (const auto& m : mixers) s.mixers.push_back(m->clone());
  return s;
}

Tensor Model::forward(const int32_t* tokens, int64_t T, State& st, const std::function<void()>& tick,
                      std::vector<Tensor>* layer_hidden) const {
  Tensor y = run(tokens, T, st,
                 [T](const Mixer& m, MixerState& ms, const float* x, float* out) { m.forward(x, T, ms, out); }, tick,
                 layer_hidden);
  st.pos += T;
  return y;
}

Tensor Model::forward_cp(const int32_t* tokens, const CpCtx& ctx, State& st, const std::function<void()>& tick) const {
  DZ_CHECK(st.pos == 0, "forward_cp needs a fresh state (prefill of a whole document)");
  const int64_t R = ctx.lay->local_rows();
  Tensor y = run(tokens, R, st,
                 [&ctx](const Mixer& m, MixerState& ms, const float* x, float* out) { m.forward_cp(x, ctx, ms, out); },
                 tick, nullptr);
  st.pos = ctx.lay->length;
  return y;
}

Tensor Model::run(const int32_t* tokens, int64_t T, State& st, const MixFn& mix, const std::function<void()>& tick,
                  std::vector<Tensor>* layer_hidden) const {
  const int64_t D = cfg_.hidden_size, V = cfg_.vocab_size;
  const float eps = cfg_.rms_norm_eps;
  const bool zc = cfg_.norm_zero_centered;
  Tensor h({T, D});  // residual stream [T, D]
  for (int64_t t = 0; t < T; ++t) {
    DZ_CHECK(tokens[t] >= 0 && tokens[t] < V, "token id ", tokens[t], " outside the vocabulary of ", V);
    std::memcpy(h.row(t), embed_.row(tokens[t]), size_t(D) * sizeof(float));
  }
  if (layer_hidden) {
    layer_hidden->clear();
    layer_hidden->push_back(h);
  }
  Tensor normed({T, D}), out({T, D});
  std::unique_ptr<AttnRes::Stream> ar;
  if (attn_res_) ar = std::make_unique<AttnRes::Stream>(attn_res_->begin(h.ptr(), T));
  Tensor input({T, D});
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& L = layers_[i];
    // token mixer
    const float* x = h.ptr();
    if (ar) {
      attn_res_->sublayer_input(*ar, int(i), 0, input.ptr());
      x = input.ptr();
    }
    rmsnorm(x, L.attn_norm.ptr(), normed.ptr(), T, D, eps, zc);
    mix(*L.mixer, *st.mixers[i], normed.ptr(), out.ptr());
    if (ar) attn_res_->add_output(*ar, int(i), 0, out.ptr());
    for (int64_t j = 0; j < T * D; ++j) h[j] += out[j];
    // FFN
    x = h.ptr();
    if (ar) {
      attn_res_->sublayer_input(*ar, int(i), 1, input.ptr());
      x = input.ptr();
    }
    rmsnorm(x, L.ffn_norm.ptr(), normed.ptr(), T, D, eps, zc);
    L.ffn->forward(normed.ptr(), T, out.ptr());
    if (ar) attn_res_->add_output(*ar, int(i), 1, out.ptr());
    for (int64_t j = 0; j < T * D; ++j) h[j] += out[j];
    if (layer_hidden) layer_hidden->push_back(h);
    if (tick) tick();
  }
  if (ar) attn_res_->final_output(*ar, h.ptr());
  Tensor y({T, D});
  rmsnorm(h.ptr(), final_norm_.ptr(), y.ptr(), T, D, eps, zc);
  return y;
}

void Model::logits(const float* hidden, int64_t rows, float* out) const { head_.logits_full(hidden, rows, out); }

static double logsumexp(const float* x, int64_t V) {
  float mx = x[0];
  for (int64_t i = 1; i < V; ++i) mx = x[i] > mx ? x[i] : mx;
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(double(x[i]) - mx);
  return double(mx) + std::log(s);
}

double log_softmax_at(const float* logits, int64_t V, int64_t target) {
  return double(logits[target]) - logsumexp(logits, V);
}

void log_softmax(const float* logits, int64_t V, float* out) {
  double lse = logsumexp(logits, V);
  for (int64_t i = 0; i < V; ++i) out[i] = float(double(logits[i]) - lse);
}

}  // namespace dz
