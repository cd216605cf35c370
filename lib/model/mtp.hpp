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
//   DeepSeek-V4 (vLLM's deepseek_v4_mtp): mtp.0.{enorm, hnorm, e_proj, h_proj, norm, hc_head_*} and
//     a V4 block (attn.*, ffn.*, attn_norm, ffn_norm, hc_{attn,ffn}_*; its attention kind from the
//     config's entry num_hidden_layers, the sliding window in every published one). It reads the
//     model's mHC streams before the head [N, D] per row: each stream normed by hnorm and projected
//     by h_proj, e_proj(enorm(embedding)) added to every stream; then the block on the streams, its
//     own weighted head (hc_head_*), norm and the model's LM head; a chained draft feeds the block's
//     streams back. Its copies emb.tok_emb / head are the model's (accepted, not read).
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
#include "ops/hyper.hpp"

namespace dz {

struct MtpLayer {
  ModelConfig cfg;  // the model's, with the MTP block appended to cfg.layers (its modules read it)
  int layer = 0;    // the block's index there: the model's num_layers
  bool carry_normed = false;  // a chained draft's hidden: the normed output (Qwen) or the block's (DeepSeek)
  // DeepSeek / GLM: the row at position 0 (hidden h_0, token 1) gets a zero embedding, as vLLM's and
  // SGLang's deepseek_mtp / glm4_moe_mtp do ("not needed by MTP"); Qwen3-Next's does not.
  bool mask_first = false;
  bool streams_in = false;  // DeepSeek-V4: `hidden` and the carry are mHC streams [rows, N·D]
  DTensor enorm, hnorm;       // [D] F32
  DTensor proj;               // [D, 2D] weight dtype: [emb | hidden] -> D (DeepSeek, Qwen)
  // DeepSeek-V4: e_proj, h_proj [D, D]; the block's mHC (mixer, FFN) and the weighted head, padded
  // by upload_hc_head so that hc_pre's collapse is the head
  DTensor e_proj, h_proj;
  DTensor hc_fn[2], hc_base[2], hc_scale[2];
  DTensor head_fn, head_base, head_scale;
  HcParams hp;
  DTensor attn_norm, ffn_norm, norm;  // [D] F32
  std::unique_ptr<Mixer> mixer;
  std::unique_ptr<Ffn> ffn;

  struct Out {
    DTensor normed;  // [rows, D] act: the LM head's input
    DTensor carry;   // [rows, D] act (V4: [rows, N·D]): what a chained draft continues from
  };
  // rows: (next_tokens[r], hidden[r]) packed over documents (cu), st[b] the block's state of
  // document b (its positions continue from st[b]->pos).
  int64_t width() const { return streams_in ? hp.N * cfg.hidden_size : cfg.hidden_size; }  // of hidden, carry
  Out forward(Backend& be, const DTensor& embed, const int32_t* next_tokens, const DTensor& hidden,
              const std::vector<int64_t>& cu, const std::vector<MixerState*>& st) const;

 private:
  // DeepSeek-V4: from emb = enorm(embedding) [rows, D] (act) and the streams hidden [rows, N·D]
  Out forward_streams(Backend& be, const DTensor& emb, const int32_t* next_tokens, const DTensor& hidden,
                      const std::vector<int64_t>& cu, const std::vector<MixerState*>& st) const;
};

// Whether dayzero runs the MTP layer of cfg's family (DeepSeek-V3.2 / GLM-5, Qwen3-Next / Qwen3.5,
// DeepSeek-V4; not GLM-5.3-Flash or Kimi, whose releases carry none).
bool mtp_supported(const ModelConfig& cfg);

// Builds the MTP layer of cfg's family from ck (the checkpoint's names; generated in make-model's
// mode); refuses a config that declares none and the families whose MTP layer is not built.
std::unique_ptr<MtpLayer> make_mtp_layer(const ModelConfig& cfg, Checkpoint& ck, const TpShard& tp, Backend& be);

}  // namespace dz
