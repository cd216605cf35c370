// The hybrid model on the CPU reference backend: embedding, a list of (mixer, FFN) layers with
// pre-norms and either the additive residual or Block AttnRes, the final norm and the LM head.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.hpp"
#include "core/tensor.hpp"
#include "io/checkpoint.hpp"
#include "model/attn_res.hpp"
#include "model/lm_head.hpp"
#include "model/module.hpp"
#include "model/parallel.hpp"
#include "backend/backend.hpp"

namespace dz {

struct MtpLayer;

class Model {
 public:
  // Loads DIR/config.json and the safetensors weights, strictly: any missing, unexpected or
  // mis-shaped tensor is an error naming it.
  // With tp.size > 1 each rank keeps only its tensor-parallel shard (heads, FFN width, vocabulary).
  // kv_cache_fp8 / index_mxfp8 select the emulated low-precision caches (ModelConfig, DESIGN §5).
  // Weights are uploaded once to `be` (its weight dtype) from the same TP slice on every backend.
  // dummy_weights: config.json alone, deterministic random weights (Checkpoint::dummy, seed 0);
  // every layout of the same config gets the same values.
  // load_mtp: also the checkpoint's MTP layer (model/mtp.hpp), the drafter of --speculative mtp.
  static std::unique_ptr<Model> load(const std::string& dir, const TpShard& tp = TpShard{}, bool kv_cache_fp8 = false,
                                     bool index_mxfp8 = false, Backend& be = cpu_backend(),
                                     bool dummy_weights = false, bool load_mtp = false);
  // Builds from any Checkpoint (a real one, or Checkpoint::random for make-model).
  static std::unique_ptr<Model> build(const ModelConfig& cfg, Checkpoint& ck, const TpShard& tp = TpShard{},
                                      Backend& be = cpu_backend());
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  Backend& backend() const { return *be_; }

  struct State {
    std::vector<std::unique_ptr<MixerState>> mixers;  // per layer
    int64_t pos = 0;                                  // tokens consumed
    // The MTP layer's (models loaded with it): its state, one position behind the model's (its row
    // i needs token i + 1), and what it reads of the row that waits for that token (mtp_in: [1, D] or [1, N·D]).
    std::unique_ptr<MixerState> mtp;
    DTensor mtp_pending;
    // Rows mtp_extend(defer) left for the next mtp_draft's first forward ([n, width] and their next
    // tokens): a verify step's catch-up and the next first draft are then one forward of the layer.
    DTensor mtp_deferred;
    std::vector<int32_t> mtp_deferred_next;
    State clone() const;
  };
  State make_state() const;

  // tokens [T] (host) at absolute positions st.pos .. st.pos+T-1 -> final hidden states after
  // the final norm [T, D] (act dtype, on the backend). `tick` is called between layers (the job
  // uses it to keep MPI progressing). layer_hidden, when given, receives the residual stream after
  // the embedding and after each layer (num_layers + 1 host tensors [T, D], as transformers'
  // output_hidden_states before the final norm).
  // stats (optional): each sub-layer's time under "mixer_<kind>" / "ffn_<kind>" (GPU time when
  // stats->device is set).
  // mtp_in (optional): what the MTP layer reads of these rows (mtp_extend's `hidden`): the returned
  // states, or DeepSeek-V4's streams before its head [T, N·D] (act dtype).
  DTensor forward(const int32_t* tokens, int64_t T, State& st, const std::function<void()>& tick = {},
                  std::vector<Tensor>* layer_hidden = nullptr, WorkStats* stats = nullptr,
                  DTensor* mtp_in = nullptr) const;
  // Context-parallel prefill of a whole document (st fresh): tokens [R] are this rank's rows in
  // ctx.lay order; returns their final hidden states [R, D]. Every CP rank ends with the state
  // of the whole document (decode continues with forward()).
  DTensor forward_cp(const int32_t* tokens, const CpCtx& ctx, State& st, const std::function<void()>& tick = {},
                     DTensor* mtp_in = nullptr) const;
  // B documents in one forward (varlen): tokens [cu[B]] concatenated, cu [B + 1] their row offsets,
  // *states[b] each document's state (fresh for a packed prefill; after its prompt for a batched
  // decode step of one token each). Embedding, norms, FFN / MoE, AttnRes and the LM head's rows see
  // all cu[B] rows at once; each token mixer runs per document on its rows, so every document equals
  // its own forward(). Returns the final hidden states [cu[B], D].
  DTensor forward_packed(const int32_t* tokens, const std::vector<int64_t>& cu, const std::vector<State*>& states,
                         const std::function<void()>& tick = {}, WorkStats* stats = nullptr,
                         DTensor* mtp_in = nullptr) const;
  // Speculative decoding (DESIGN §11): the next forward_packed over these states is a verify
  // forward; spec_keep then keeps keep[b] of document b's verify rows (1 .. its row count) in every
  // layer and undoes the rest, as if only those rows had been forwarded.
  void spec_begin(const std::vector<State*>& states, SpecRestore how) const;
  void spec_keep(const std::vector<State*>& states, const std::vector<int64_t>& keep) const;
  // logits[rows, V] (host) = hidden[rows, D] · lm_head^T (the full rows, on every TP rank)
  void logits(const DTensor& hidden, float* out) const { head_.logits_full(hidden, out); }
  void logits(const float* hidden, int64_t rows, float* out) const;

  // MTP drafts (DESIGN §11, model/mtp.hpp). mtp_extend: the model has just consumed tokens
  // [cu[B]] (packed over documents) and `hidden` is what its forward gave as mtp_in (the final
  // hidden states [cu[B], D]; DeepSeek-V4: the streams [cu[B], N·D]); the MTP layer of
  // each document forwards every row whose next token is now known (the pending row with tokens[0],
  // each row but the last with the token after it) and keeps the last row pending. out (optional):
  // the rows' normed outputs [rows, D], documents in order. defer: those rows are not forwarded now
  // but with the next mtp_draft's first rows (one forward of the layer a step; no out).
  bool has_mtp() const { return mtp_ != nullptr; }
  void mtp_extend(const int32_t* tokens, const std::vector<int64_t>& cu, const DTensor& hidden,
                  const std::vector<State*>& states, DTensor* out = nullptr, bool defer = false) const;
  // Up to k[b] greedy drafts for document b whose next token is cur[b] (its pending row then
  // forwarded for good); the chained drafts' rows are undone in the MTP state before returning.
  // first_logits (optional): [B, V] the logits of each drafting document's first draft (rows of
  // documents with k[b] == 0 untouched).
  std::vector<std::vector<int32_t>> mtp_draft(const std::vector<int32_t>& cur, const std::vector<State*>& states,
                                              const std::vector<int64_t>& k, std::vector<float>* first_logits = nullptr) const;
  // ids[rows] = argmax of each row's logits (the lower id on ties), on every TP rank.
  void greedy(const DTensor& hidden, int32_t* ids) const { head_.greedy(hidden, ids); }
  const LmHead& head() const { return head_; }

 private:
  Model() = default;
  friend class DecodeRunner;
  // The layer stack shared by forward and forward_cp; `mix` runs one layer's token mixer.
  using MixFn = std::function<void(size_t layer, const Mixer&, const DTensor& x, const DTensor& out)>;
  DTensor run(const int32_t* tokens, int64_t T, const MixFn& mix, const std::function<void()>& tick,
              std::vector<Tensor>* layer_hidden, WorkStats* stats, DTensor* mtp_in = nullptr,
              bool cp_rows = false) const;
  // The buffers of one pass over T rows: residual stream h [T, D] F32, the sub-layers' normed
  // input and output [T, D] act, the AttnRes sub-layer input [T, D] F32 and depth stream.
  struct Pass {
    DTensor h, normed, out, input;
    DTensor streams, coeff;  // mHC models: the N residual streams [T, N·D] F32, a sub-layer's coefficients
    std::shared_ptr<AttnRes::Stream> ar;  // AttnRes models, from the first embed_into
    const int32_t* tokens = nullptr;      // the rows' token ids (host), from embed_into (hash-routed MoE)
    bool cp_rows = false;  // forward_cp: the CP ranks' rows differ (expert parallelism exchanges them)
    // mHC: the streams after the last sub-layer are kept (layer snapshots), else a mean head's last
    // post writes the mean into h without them (hc_post_mean)
    bool keep_streams = false;
  };
  Pass make_pass(int64_t T) const;
  void embed_into(const int32_t* tokens, Pass& p) const;  // tokens [T] (host) -> p.h; (re)starts p.ar
  void sublayer(int64_t k, const MixFn& mix, Pass& p, WorkStats* stats) const;  // k = 2 * layer + (0 mixer | 1 FFN)
  DTensor finish(Pass& p) const;  // the AttnRes output mixture and the final norm -> [T, D] act
  int64_t sublayers() const { return 2 * int64_t(layers_.size()); }
  bool graph_safe(int64_t k) const {
    const Layer& L = layers_[size_t(k / 2)];
    return k % 2 == 0 ? L.mixer->graph_safe_decode() : L.ffn->graph_safe();
  }

  ModelConfig cfg_;
  Backend* be_ = nullptr;
  DTensor embed_;  // [V, D] weight dtype (checkpoints store it in BF16: exact on both backends)
  LmHead head_;    // vocabulary-parallel under TP
  DTensor final_norm_;
  struct Layer {
    DTensor attn_norm, ffn_norm;  // [D] F32
    DTensor hc_fn[2], hc_base[2], hc_scale[2];  // mHC (mixer, FFN): [(2+N)N, N·D], [(2+N)N], [3] F32
    std::unique_ptr<Mixer> mixer;
    std::unique_ptr<Ffn> ffn;
    std::string mixer_key, ffn_key;  // stage names in WorkStats
  };
  std::vector<Layer> layers_;
  std::unique_ptr<AttnRes> attn_res_;
  int64_t hc_ = 0;  // mHC streams (cfg.hc_mult); 0: the plain residual
  // DeepSeek-V4's weighted head (hc_head): its [N, N·D] weights zero-padded to hc_pre's
  // [(2+N)N, N·D] (base likewise, scale [hc_scale, 1, 1]): hc_pre's collapse is then the head.
  DTensor head_fn_, head_base_, head_scale_;
  HcParams hc_params() const;  // the mHC settings of every hc_pre call (sub-layers, the weighted head)
  std::unique_ptr<MtpLayer> mtp_;  // cfg.load_mtp
};

// Marks the multi-token-prediction layers a config declares (DeepSeek num_nextn_predict_layers,
// Qwen3.5 mtp_num_hidden_layers) as known, so strict loading accepts published checkpoints that
// carry them. Returns how many tensors it accepted.
int64_t skip_mtp_layers(const ModelConfig& cfg, Checkpoint& ck);
// Qwen3-Next's release: mtp.* tensors with no MTP key in config.json. Sets cfg.mtp_layers from the
// names and returns it (0: nothing inferred). Call after adopt_text_model, before building.
int64_t infer_mtp_layers(ModelConfig& cfg, const Checkpoint& ck);

// One sub-layer's mHC weights (which 0: the token mixer, 1: the FFN) under PREFIX: the published
// names hc_{attn,ffn}_{fn,base,scale}, or transformers' own {attn,ffn}_hc.{fn,base,scale}.
struct HcTensors {
  Tensor fn, base, scale;  // [(2+N)N, N*D], [(2+N)N], [3]
};
HcTensors get_hc_tensors(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, int which);

// A weighted mHC head (DeepSeek-V4's hc_head, its MTP layer's) on the backend: fn [N, N·D], base
// [N], scale [1] zero-padded to hc_pre's [(2+N)N, N·D], [(2+N)N] and [scale, 1, 1], so that
// hc_pre's collapse is the head. Undefined tensors for a dry run's empty ones.
struct HcHead {
  DTensor fn, base, scale;
};
HcHead upload_hc_head(const Tensor& fn, const Tensor& base, const Tensor& scale, int64_t N, int64_t D, Backend& be);

// How a checkpoint packages its text model (multimodal wrappers), found from its tensor names.
struct TextPackaging {
  std::string prefix;          // the file's prefix read as "model." ("model." when unwrapped)
  std::string lm_head;         // the file's name of lm_head.weight's prefix ("lm_head." when unwrapped)
  int64_t vision_tensors = 0;  // recognised and not loaded
  std::vector<std::string> vision_prefixes;
};
// Reads a wrapper's text model under dayzero's names (model.language_model.X and
// language_model.model.X as model.X, language_model.lm_head as lm_head) and, when the config
// declares a vision tower, marks its tensors as recognised. Call before building the model.
TextPackaging adopt_text_model(const ModelConfig& cfg, Checkpoint& ck);

// log-softmax helpers over one row of logits (fp64 accumulation, deterministic).
// Returns log p(target).
double log_softmax_at(const float* logits, int64_t V, int64_t target);
// Fills out[V] with log-probabilities.
void log_softmax(const float* logits, int64_t V, float* out);

}  // namespace dz
