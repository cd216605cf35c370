// A checkpoint's multi-token-prediction (MTP) layer, the drafter of `--speculative mtp`
// (DESIGN §11, docs/speculative.md). One step over a row i: the embedding of token i + 1 and the
// main model's final hidden state at i, each RMS-normed, concatenated [emb; hidden] and projected
// back to D (DeepSeek / GLM: the embedding of the row at position 0 is zeroed), then one decoder layer (pre-norm residual) and its own final norm; the main model's
// LM head reads the draft for position i + 2 from it.
//   DeepSeek-V3.2 / GLM-5: model.layers.{L}.{enorm, hnorm, eh_proj, shared_head.norm} and a decoder
//     block under model.layers.{L}. (MLA + its own DSA indexer, the MoE); its copies of the
//     embedding and the head (embed_tokens, shared_head.head) are the main model's and are only
//     accepted. A chained draft feeds the block's output before the norm back (as vLLM does).
//   Qwen3-Next / Qwen3.5: mtp.{fc, pre_fc_norm_embedding, pre_fc_norm_hidden, norm} and
//     mtp.layers.0. (gated GQA + the MoE or MLP); a chained draft feeds the normed output back.
// Only the first MTP layer of a checkpoint that has several is built (every published one has one);
// the others are accepted and skipped.
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "config/model_config.hpp"
#include "core/dtensor.hpp"
#include "io/checkpoint.hpp"
#include "model/module.hpp"
#include "model/parallel.hpp"

namespace dz {

struct MtpLayer {
  ModelConfig cfg;  // the model's, with the MTP block appended to cfg.layers (its modules read it)
  int layer = 0;    // the block's index there: the model's num_layers
  bool carry_normed = false;  // a chained draft's hidden: the normed output (Qwen) or the block's (DeepSeek)
  // DeepSeek / GLM: the row at position 0 (hidden h_0, token 1) gets a zero embedding, as vLLM's and
  // SGLang's deepseek_mtp / glm4_moe_mtp do ("not needed by MTP"); Qwen3-Next's does not.
  bool mask_first = false;
  DTensor enorm, hnorm;       // [D] F32
  DTensor proj;               // [D, 2D] weight dtype: [emb | hidden] -> D
  DTensor attn_norm, ffn_norm, norm;  // [D] F32
  std::unique_ptr<Mixer> mixer;
  std::unique_ptr<Ffn> ffn;

  struct Out {
    DTensor normed;  // [rows, D] act: the LM head's input
    DTensor carry;   // [rows, D] act: the hidden state a chained draft continues from
  };
  // rows: (next_tokens[r], hidden[r]) packed over documents (cu), st[b] the block's state of
  // document b (its positions continue from st[b]->pos).
  Out forward(Backend& be, const DTensor& embed, const int32_t* next_tokens, const DTensor& hidden,
              const std::vector<int64_t>& cu, const std::vector<MixerState*>& st) const;
};

// Whether dayzero runs the MTP layer of cfg's family (DeepSeek-V3.2 / GLM-5, Qwen3-Next / Qwen3.5:
// the plain residual; DeepSeek-V4's carries the mHC streams and is not built).
bool mtp_supported(const ModelConfig& cfg);

// Builds the MTP layer of cfg's family from ck (the checkpoint's names; generated in make-model's
// mode); refuses a config that declares none and the families whose MTP layer is not built.
std::unique_ptr<MtpLayer> make_mtp_layer(const ModelConfig& cfg, Checkpoint& ck, const TpShard& tp, Backend& be);

}  // namespace dz
