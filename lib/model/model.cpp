#include "model/model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/linalg.hpp"
#include "core/log.hpp"
#include "model/attn_res.hpp"
#include "model/mtp.hpp"
#include "ops/hyper.hpp"
#include "ops/norm.hpp"

namespace dz {

Model::~Model() = default;

namespace {
// N of a Qwen-layout MTP tensor mtp.layers.N.*; -1 for any other name (mtp.fc, mtp.norm, a non-number).
int64_t mtp_layer_index(const std::string& name) {
  if (name.rfind("mtp.layers.", 0) != 0) return -1;
  const std::string idx = name.substr(11, name.find('.', 11) - 11);
  if (idx.empty() || idx.size() >= 6 || idx.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(idx);
}
}  // namespace

int64_t skip_mtp_layers(const ModelConfig& cfg, Checkpoint& ck) {
  // Multi-token-prediction layers are run only by --speculative mtp (model/mtp.hpp, which reads the
  // first one): the rest are accepted by name (only as many as the config declares) and skipped,
  // and so are all of them without --speculative mtp. DeepSeek appends them
  // as model.layers.{L..L+n-1}; Qwen3.5 keeps them under mtp. (mtp.layers.{0..n-1}, mtp.fc, norms).
  const int64_t n = cfg.mtp_layers;
  if (n <= 0) return 0;
  int64_t skipped = 0;
  ck.set_dry_run(true);
  for (const auto& name : ck.unused()) {
    bool mtp = false;
    for (int64_t l = cfg.num_layers; l < cfg.num_layers + n; ++l) mtp |= name.rfind(str("model.layers.", l, "."), 0) == 0;
    if (name.rfind("mtp.", 0) == 0) {
      const int64_t i = mtp_layer_index(name);
      mtp = name.rfind("mtp.layers.", 0) != 0 || (i >= 0 && i < n);
    }
    if (mtp) ck.get(name, ck.info(name).shape), ++skipped;
  }
  ck.set_dry_run(false);
  return skipped;
}

int64_t infer_mtp_layers(ModelConfig& cfg, const Checkpoint& ck) {
  // Qwen3-Next's release ships mtp.* beside a config.json that declares no MTP layer (vLLM reads
  // one by default): the layers are counted from the tensor names. (Qwen3.5 declares its own.)
  if (cfg.model_type != "qwen3_next" || cfg.mtp_layers != 0) return 0;
  int64_t n = 0;
  bool any = false;
  for (const auto& name : ck.names()) {
    if (name.rfind("mtp.", 0) != 0) continue;
    any = true;
    n = std::max<int64_t>(n, mtp_layer_index(name) + 1);
  }
  if (!any) return 0;
  cfg.mtp_layers = std::max<int64_t>(n, 1);
  return cfg.mtp_layers;
}

HcHead upload_hc_head(const Tensor& fn, const Tensor& base, const Tensor& scale, int64_t N, int64_t D, Backend& be) {
  if (fn.empty()) return {};
  const int64_t Cn = (2 + N) * N;
  Tensor f({Cn, N * D}), b({Cn}), sc({3});
  std::copy_n(fn.ptr(), N * N * D, f.ptr());
  std::copy_n(base.ptr(), N, b.ptr());
  sc.ptr()[0] = scale.ptr()[0], sc.ptr()[1] = sc.ptr()[2] = 1.f;
  return {be.param(f), be.param(b), be.param(sc)};
}

HcTensors get_hc_tensors(const ModelConfig& cfg, Checkpoint& ck, const std::string& p, int which) {
  const int64_t N = cfg.hc_mult, D = cfg.hidden_size, Cn = (2 + N) * N;
  const std::string site = which == 0 ? "attn" : "ffn";
  const bool internal = !ck.generating() && !ck.has(p + "hc_" + site + "_fn") && ck.has(p + site + "_hc.fn");
  auto nm = [&](const char* part) { return internal ? p + site + "_hc." + part : p + "hc_" + site + "_" + part; };
  return {ck.get(nm("fn"), {Cn, N * D}, Init::normal(0.02f)), ck.get(nm("base"), {Cn}, Init::zeros()),
          ck.get(nm("scale"), {3}, Init::ones())};
}

TextPackaging adopt_text_model(const ModelConfig& cfg, Checkpoint& ck) {
  TextPackaging tp{"model.", "lm_head.", 0, {}};
  if (ck.generating()) return tp;
  bool wrapped_hf = false, wrapped_lm = false;  // model.language_model.* / language_model.model.*
  for (const auto& n : ck.names()) {
    wrapped_hf |= n.rfind("model.language_model.", 0) == 0;
    wrapped_lm |= n.rfind("language_model.model.", 0) == 0;
  }
  DZ_CHECK(!(wrapped_hf && wrapped_lm), "checkpoint ", ck.dir(),
           " holds both model.language_model.* and language_model.model.* tensors: which one is the text model?");
  if (wrapped_hf) {
    tp.prefix = "model.language_model.";
    ck.rename_prefix(tp.prefix, "model.");
  } else if (wrapped_lm) {
    tp.prefix = "language_model.model.";
    tp.lm_head = "language_model.lm_head.";
    ck.rename_prefix(tp.prefix, "model.");
    ck.rename_prefix(tp.lm_head, "lm_head.");
  }
  if (cfg.has_vision) {
    // Vision towers and their projectors as the wrappers publish them (Qwen3.5 model.visual.,
    // GLM model.visual., Kimi vision_tower. + mm_projector. / multi_modal_projector.).
    for (const char* p : {"model.visual.", "visual.", "model.vision_tower.", "vision_tower.", "vision_model.",
                          "model.multi_modal_projector.", "multi_modal_projector.", "mm_projector.",
                          "model.mm_projector."})
      if (int64_t k = ck.skip_prefix(p)) tp.vision_tensors += k, tp.vision_prefixes.push_back(p);
  }
  return tp;
}

std::unique_ptr<Model> Model::load(const std::string& dir, const TpShard& tp, bool kv_cache_fp8, bool index_mxfp8,
                                   Backend& be, bool dummy_weights, bool load_mtp) {
  ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
  cfg.kv_cache_fp8 = kv_cache_fp8;
  cfg.index_mxfp8 = index_mxfp8;
  cfg.load_mtp = load_mtp;
  if (dummy_weights) {
    auto ck = Checkpoint::dummy(0);
    return build(cfg, *ck, tp, be);
  }
  auto ck = Checkpoint::open(dir);
  DZ_CHECK(ck->mxfp4_tensors() == 0 || cfg.weights_mxfp4, dir, ": the checkpoint holds ", ck->mxfp4_tensors(),
           " MXFP4-packed weights (X.weight_packed + X.weight_scale) but config.json declares no compressed-tensors ",
           "mxfp4-pack-quantized quantization_config");
  const TextPackaging pk = adopt_text_model(cfg, *ck);
  if (const int64_t n = infer_mtp_layers(cfg, *ck))
    log_root(str(dir, ": mtp.* tensors and no mtp_num_hidden_layers / num_nextn_predict_layers in config.json: read as ",
                 n, " MTP layer(s)"));
  if (!cfg.wrapper_model_type.empty())
    log_root(str(cfg.wrapper_model_type, ": scoring its text model (tensors under ", pk.prefix, ")",
                 pk.vision_tensors ? str(", vision tower recognised and not loaded (", pk.vision_tensors, " tensors)") : ""));
  auto m = build(cfg, *ck, tp, be);
  skip_mtp_layers(cfg, *ck);
  ck->check_all_used();
  if (const int64_t n4 = ck->mxfp4_tensors())
    log_root(str("MXFP4 weights: ", n4, " in the checkpoint (decoded exactly); ", be.mxfp4_weights_kept(),
                 " routed-expert stacks kept in MXFP4 on ", be.name(), ", the others as ", to_string(be.weight_dtype()),
                 " (the CPU reference; or a TP slice of the experts' width off the 32-column groups, or not a routed expert)"));
  if (const int64_t n8 = ck->fp8_block_tensors())
    log_root(str("FP8 block-scaled weights: ", n8, " in the checkpoint, ", be.fp8_weights_kept(), " kept in FP8 on ",
                 be.name(), "; the others as ", to_string(be.weight_dtype()),
                 " (the CPU reference; or not a linear layer's weight, in-features not a multiple of 128, a TP "
                 "slice off the 128-row blocks, stacked experts)"));
  return m;
}

std::unique_ptr<Model> Model::build(const ModelConfig& cfg, Checkpoint& ck, const TpShard& tp, Backend& be) {
  cfg.validate();
  std::unique_ptr<Model> m(new Model());
  m->cfg_ = cfg;
  m->be_ = &be;
  // Host tensors of a dry run (inspect) have shapes and no data: nothing to upload.
  auto param = [&](const Tensor& t) { return t.empty() ? DTensor{} : be.param(t); };
  const int64_t V = cfg.vocab_size, D = cfg.hidden_size;
  // Zero-centred norms store w with the output scaled by (1 + w): generated weights start at 0.
  const Init norm_init = cfg.norm_zero_centered ? Init::zeros() : Init::ones();
  const Tensor embed = ck.get("model.embed_tokens.weight", {V, D}, Init::normal(1.0f));
  if (!embed.empty()) m->embed_ = be.upload(embed, be.weight_dtype());  // a table, never an FP8 GEMM operand
  // GLM-5 shared-indexer layers: a share from each layer that runs its indexer to those after it
  // that take its Top-K (made only when some layer takes it: it keeps a call's sets alive).
  std::shared_ptr<TopkShare> share;
  int readers = 0;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string p = str("model.layers.", i, ".");
    const LayerSpec& ls = cfg.layers[size_t(i)];
    TopkLink link;
    if (ls.mixer == MixerKind::MLA && ls.has_indexer) {
      if (ls.shared_indexer) {
        link.take = share, link.reader = readers++;
      } else {
        const bool taken = size_t(i) + 1 < cfg.layers.size() && cfg.layers[size_t(i) + 1].shared_indexer;
        share = taken ? make_topk_share() : nullptr, readers = 0;
        link.publish = share;
      }
    }
    Layer L;
    if (cfg.hc_mult > 0)
      for (int w = 0; w < 2; ++w) {
        const HcTensors t = get_hc_tensors(cfg, ck, p, w);
        L.hc_fn[w] = param(t.fn);
        L.hc_base[w] = param(t.base);
        L.hc_scale[w] = param(t.scale);
      }
    const bool v4 = cfg.family == Family::DeepseekV4;  // DeepSeek's own names: attn_norm / ffn_norm
    L.attn_norm = param(ck.get(p + (v4 ? "attn_norm.weight" : "input_layernorm.weight"), {D}, norm_init));
    switch (ls.mixer) {
      case MixerKind::KDA: L.mixer = make_kda_mixer(cfg, int(i), ck, p, tp, be); break;
      case MixerKind::GDN: L.mixer = make_gdn_mixer(cfg, int(i), ck, p, tp, be); break;
      case MixerKind::MLA: L.mixer = make_mla_mixer_linked(cfg, int(i), ck, p, tp, be, link); break;
      case MixerKind::GQA: L.mixer = make_gqa_mixer(cfg, int(i), ck, p, tp, be); break;
      case MixerKind::DSV4: L.mixer = make_dsv4_mixer(cfg, int(i), ck, p, tp, be); break;
    }
    L.ffn_norm = param(ck.get(p + (v4 ? "ffn_norm.weight" : "post_attention_layernorm.weight"), {D}, norm_init));
    L.ffn = ls.ffn == FfnKind::MoE ? make_moe_ffn(cfg, int(i), ck, p, tp, be) : make_mlp_ffn(cfg, int(i), ck, p, tp, be);
    const char* mk[kMixerKinds] = {"mixer_kda", "mixer_gdn", "mixer_mla", "mixer_gqa", "mixer_dsv4"};
    L.mixer_key = ls.mixer == MixerKind::MLA && ls.has_indexer ? (ls.shared_indexer ? "mixer_mla_dsa_shared" : "mixer_mla_dsa")
                                                                : mk[int(ls.mixer)];
    L.ffn_key = ls.ffn == FfnKind::MoE ? "ffn_moe" : "ffn_mlp";
    m->layers_.push_back(std::move(L));
  }
  m->hc_ = cfg.hc_mult;
  DZ_CHECK(!(m->hc_ > 0 && cfg.attn_res_block_size > 0), "hyper-connections and Block AttnRes together are not supported");
  if (cfg.attn_res_block_size > 0) {
    m->attn_res_ = std::make_unique<AttnRes>(cfg, ck);
    m->attn_res_->upload(be);
  }
  if (cfg.hc_head_weighted) {
    const int64_t N = cfg.hc_mult;
    const HcHead h = upload_hc_head(ck.get("model.hc_head.hc_fn", {N, N * D}, Init::normal(0.02f)),
                                    ck.get("model.hc_head.hc_base", {N}, Init::zeros()),
                                    ck.get("model.hc_head.hc_scale", {1}, Init::ones()), N, D, be);
    m->head_fn_ = h.fn, m->head_base_ = h.base, m->head_scale_ = h.scale;
  }
  m->final_norm_ = param(ck.get("model.norm.weight", {D}, norm_init));
  const std::string head = cfg.family == Family::DeepseekV4 ? "head.weight" : "lm_head.weight";
  if (cfg.tie_word_embeddings)
    m->head_ = LmHead(embed, V, D, tp, be);
  else
    m->head_ = LmHead(ck.get(head, {V, D}, Init::normal(0.02f)), V, D, tp, be);
  if (cfg.load_mtp) m->mtp_ = make_mtp_layer(cfg, ck, tp, be);
  return m;
}

HcParams Model::hc_params() const {
  HcParams hp;
  hp.N = hc_, hp.iters = int(cfg_.hc_sinkhorn_iters), hp.eps_norm = cfg_.rms_norm_eps, hp.eps_hc = cfg_.hc_eps;
  return hp;
}

Model::State Model::make_state() const {
  State st;
  for (const auto& L : layers_) st.mixers.push_back(L.mixer->make_state());
  if (mtp_) st.mtp = mtp_->mixer->make_state();
  return st;
}

Model::State Model::State::clone() const {
  State s;
  s.pos = pos;
  for (const auto& m : mixers) s.mixers.push_back(m->clone());
  if (mtp) s.mtp = mtp->clone();
  s.mtp_pending = mtp_pending;  // never written in place: mtp_extend replaces it
  s.mtp_deferred = mtp_deferred, s.mtp_deferred_next = mtp_deferred_next;  // (likewise)
  return s;
}

DTensor Model::forward(const int32_t* tokens, int64_t T, State& st, const std::function<void()>& tick,
                       std::vector<Tensor>* layer_hidden, WorkStats* stats, DTensor* mtp_in) const {
  DTensor y = run(
      tokens, T, [&st](size_t i, const Mixer& m, const DTensor& x, const DTensor& out) { m.forward(x, *st.mixers[i], out); },
      tick, layer_hidden, stats, mtp_in);
  st.pos += T;
  return y;
}

DTensor Model::forward_packed(const int32_t* tokens, const std::vector<int64_t>& cu, const std::vector<State*>& states,
                              const std::function<void()>& tick, WorkStats* stats, DTensor* mtp_in) const {
  const size_t B = states.size();
  DZ_CHECK(B >= 1 && cu.size() == B + 1 && cu[0] == 0, "forward_packed: ", B, " states for ", cu.size(), " offsets");
  for (size_t b = 0; b < B; ++b) DZ_CHECK(cu[b + 1] > cu[b], "forward_packed: document ", b, " has no rows");
  DTensor y = run(
      tokens, cu[B],
      [&](size_t i, const Mixer& m, const DTensor& x, const DTensor& out) {
        std::vector<MixerState*> ms(B);  // the token mixer keeps documents apart; the rest is per row
        for (size_t b = 0; b < B; ++b) ms[b] = states[b]->mixers[i].get();
        m.forward_packed(x, cu, ms, out);
      },
      tick, nullptr, stats, mtp_in);
  for (size_t b = 0; b < B; ++b) states[b]->pos += cu[b + 1] - cu[b];
  return y;
}

DTensor Model::forward_cp(const int32_t* tokens, const CpCtx& ctx, State& st, const std::function<void()>& tick,
                          DTensor* mtp_in) const {
  DZ_CHECK(st.pos == 0, "forward_cp needs a fresh state (prefill of a whole document)");
  const int64_t R = ctx.lay->local_rows();
  DTensor y = run(
      tokens, R,
      [&](size_t i, const Mixer& m, const DTensor& x, const DTensor& out) { m.forward_cp(x, ctx, *st.mixers[i], out); },
      tick, nullptr, ctx.stats, mtp_in, /*cp_rows=*/true);
  st.pos = ctx.lay->length;
  return y;
}

// The layer stack, once for every backend: residual stream h [T, D] F32; sub-layer inputs and
// outputs in the backend's activation dtype. run() is the whole pass; DecodeRunner issues the
// same pieces (pass buffers, embed, sub-layers, finish) with its graphs around them.
Model::Pass Model::make_pass(int64_t T) const {
  Backend& be = *be_;
  const int64_t D = cfg_.hidden_size;
  Pass p;
  p.h = be.alloc({T, D}, DType::F32);
  p.normed = be.act({T, D});
  p.out = be.act({T, D});
  if (attn_res_ || hc_) p.input = be.alloc({T, D}, DType::F32);
  if (hc_) {
    p.streams = be.alloc({T, hc_ * D}, DType::F32);
    p.coeff = be.alloc({T, (2 + hc_) * hc_}, DType::F32);
  }
  return p;
}

void Model::embed_into(const int32_t* tokens, Pass& p) const {
  Backend& be = *be_;
  const int64_t T = p.h.rows(), V = cfg_.vocab_size;
  for (int64_t t = 0; t < T; ++t)
    DZ_CHECK(tokens[t] >= 0 && tokens[t] < V, "token id ", tokens[t], " outside the vocabulary of ", V);
  p.tokens = tokens;
  const DTensor ids = be.upload_i32(tokens, {T});
  be.embed(embed_, ids, p.h);
  // mHC: every stream starts as the embedding; sub-layer 0 reads them as p.h (hc_pre_expand) and its
  // post writes p.streams, so they are not expanded here
  if (!attn_res_) return;
  if (p.ar)
    attn_res_->restart(be, *p.ar, p.h);
  else
    p.ar = std::make_shared<AttnRes::Stream>(attn_res_->begin(be, p.h));
}

// Sub-layer k = 2 * layer + which (which 0: the token mixer, 1: the FFN) with its pre-norm and
// residual (or AttnRes mixture).
void Model::sublayer(int64_t k, const MixFn& mix, Pass& p, WorkStats* stats) const {
  Backend& be = *be_;
  const size_t i = size_t(k / 2);
  const int which = int(k % 2);
  const Layer& L = layers_[i];
  AttnRes::Stream* ar = p.ar.get();
  if (ar) attn_res_->sublayer_input(be, *ar, int(i), which, p.input);
  // mHC: the streams collapsed by this sub-layer's pre weights and normed, here for the first
  // sub-layer, by the previous sub-layer's hc_post_pre for the others (every caller runs the
  // sub-layers 0 .. K-1 of a pass in order; a decode graph run that starts at k has p.normed from the
  // run before).
  if (hc_ && k == 0)
    be.hc_pre_expand(p.h, hc_, p.streams, L.hc_fn[which], L.hc_base[which], L.hc_scale[which], hc_params(), p.coeff,
                     p.input);
  if (!hc_ || k == 0)
    be.rmsnorm(ar || hc_ ? p.input : p.h, which == 0 ? L.attn_norm : L.ffn_norm, p.normed, cfg_.rms_norm_eps,
               cfg_.norm_zero_centered);
  {
    WorkStats::Timer t(stats, which == 0 ? L.mixer_key : L.ffn_key);
    if (which == 0)
      mix(i, *L.mixer, p.normed, p.out);
    else if (p.cp_rows)
      L.ffn->forward_cp_rows(p.normed, p.tokens, p.out);
    else
      L.ffn->forward_tokens(p.normed, p.tokens, p.out);
  }
  if (ar) attn_res_->add_output(be, *ar, int(i), which, p.out);
  if (hc_) {  // expand the output, mix the streams (and the next sub-layer's pre from them)
    if (k + 1 < sublayers()) {
      const Layer& Ln = layers_[size_t((k + 1) / 2)];
      const int wn = int((k + 1) % 2);
      const Backend::HcNorm nn{wn == 0 ? Ln.attn_norm : Ln.ffn_norm, cfg_.rms_norm_eps, cfg_.norm_zero_centered,
                               p.normed};
      if (k == 0)  // the old streams are the embedding p.h
        be.hc_post_pre_expand(p.h, p.streams, p.coeff, p.out, hc_, Ln.hc_fn[wn], Ln.hc_base[wn], Ln.hc_scale[wn],
                              hc_params(), p.coeff, p.input, nn);
      else
        be.hc_post_pre(p.streams, p.coeff, p.out, hc_, Ln.hc_fn[wn], Ln.hc_base[wn], Ln.hc_scale[wn], hc_params(),
                       p.coeff, p.input, nn);
    } else if (!head_fn_.defined() && !p.keep_streams) {
      be.hc_post_mean(p.streams, p.coeff, p.out, hc_, p.h);  // GLM-5.3-Flash's head, the streams not written
    } else {
      be.hc_post(p.streams, p.coeff, p.out, hc_);
    }
    return;
  }
  be.add(p.h, p.out);
}

DTensor Model::finish(Pass& p) const {
  Backend& be = *be_;
  if (p.ar) attn_res_->final_output(be, *p.ar, p.h);
  if (hc_ && head_fn_.defined()) {  // DeepSeek-V4's weighted head
    be.hc_pre(p.streams, head_fn_, head_base_, head_scale_, hc_params(), p.coeff, p.h);
  } else if (hc_ && p.keep_streams) {
    be.hc_mean(p.streams, hc_, p.h);  // GLM-5.3-Flash's head: the mean of the streams (else: in p.h already)
  }
  DTensor y = be.act(p.h.shape);
  be.rmsnorm(p.h, final_norm_, y, cfg_.rms_norm_eps, cfg_.norm_zero_centered);
  return y;
}

DTensor Model::run(const int32_t* tokens, int64_t T, const MixFn& mix, const std::function<void()>& tick,
                   std::vector<Tensor>* layer_hidden, WorkStats* stats, DTensor* mtp_in, bool cp_rows) const {
  Backend& be = *be_;
  Pass p = make_pass(T);
  p.cp_rows = cp_rows;
  const bool mtp_streams = mtp_in && mtp_ && mtp_->streams_in;
  p.keep_streams = layer_hidden != nullptr || mtp_streams;
  embed_into(tokens, p);
  auto snapshot = [&](const DTensor& t) {
    Tensor c({T, t.cols()});
    if (T) be.download(t, c.ptr());
    layer_hidden->push_back(std::move(c));
  };
  if (layer_hidden) {
    layer_hidden->clear();
    if (hc_) be.hc_expand(p.h, hc_, p.streams);  // (sub-layer 0 reads p.h and rewrites the streams)
    snapshot(hc_ ? p.streams : p.h);  // the embedding (mHC: in every stream, as transformers reports it)
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    sublayer(2 * int64_t(i), mix, p, stats);
    sublayer(2 * int64_t(i) + 1, mix, p, stats);
    if (layer_hidden) snapshot(hc_ ? p.streams : p.h);  // mHC: the streams [T, N·D]
    if (tick) tick();
  }
  DTensor y = finish(p);
  if (mtp_in) {
    if (mtp_streams) {
      *mtp_in = be.act(p.streams.shape);
      be.convert(p.streams, *mtp_in);
    } else {
      *mtp_in = y;
    }
  }
  return y;
}

void Model::spec_begin(const std::vector<State*>& states, SpecRestore how) const {
  Mixer::Copies copies;
  for (State* st : states) {
    DZ_CHECK(st && st->mixers.size() == layers_.size(), "spec_begin: a state of another model");
    for (size_t i = 0; i < layers_.size(); ++i) layers_[i].mixer->spec_begin(*st->mixers[i], how, &copies);
  }
  be_->copy_rows_many(copies);  // every document's and layer's snapshot copies in one launch
}

void Model::spec_keep(const std::vector<State*>& states, const std::vector<int64_t>& keep) const {
  DZ_CHECK(keep.size() == states.size(), "spec_keep: ", keep.size(), " counts for ", states.size(), " states");
  Mixer::Copies copies;
  for (size_t b = 0; b < states.size(); ++b) {
    State& st = *states[b];
    int64_t pos = -1;
    for (size_t i = 0; i < layers_.size(); ++i) {
      layers_[i].mixer->spec_keep(*st.mixers[i], keep[b], &copies);
      DZ_CHECK(pos < 0 || st.mixers[i]->pos == pos, "spec_keep: layers disagree on the position (", pos, " vs ",
               st.mixers[i]->pos, ")");
      pos = st.mixers[i]->pos;
    }
    if (pos >= 0) st.pos = pos;
  }
  be_->copy_rows_many(copies);  // the kept states of every document and layer in one launch
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
