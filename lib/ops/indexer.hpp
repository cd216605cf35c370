// DeepSeek-V3.2 DSA lightning indexer (CPU reference, fp32) and its Top-K selection.
//
// Follows transformers' deepseek_v32 (what the golden references are made with):
//   q_idx = wq_b(q_resid)                      [T, Hi, Di]   q_resid = q_a_layernorm(q_a_proj(x))
//   k_idx = LayerNorm(wk(x)) (weight + bias, eps 1e-6)   [T, Di]
//   RoPE (NeoX / rotate-half, NOT the interleaved form of the main MLA) on dims [0, rope) of both,
//   with the model's rope (YaRN included); dims [rope, Di) pass through.
//   w[t, h] = weights_proj(x)[t, h] * Hi^-0.5 * Di^-0.5
//   score(t, s) = sum_h w[t, h] * relu(q_idx[t, h] · k_idx[s]),   s <= t
// DeepSeek's own inference code also applies a Hadamard rotation to q and k (orthogonal, so the
// dot products are unchanged in exact arithmetic) and quantises both to FP8 with per-128 scales
// (its weights carry q's scale); neither is done here (the MXFP8 option emulates quantisation
// separately).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "config/model_config.hpp"
#include "core/tensor.hpp"
#include "io/checkpoint.hpp"
#include "ops/rope.hpp"

namespace dz {

// torch.nn.LayerNorm over the last dim: (x - mean) / sqrt(var + eps) * w + b (biased variance).
// rows × D; y may alias x.
void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t D, float eps);

// scores [T, S]: row t holds score(t, s) for s <= pos0 + t and -inf for later s.
//   q [T, H, D]    w [T, H] (already scaled)    k [S, D]
void indexer_scores(const float* q, const float* w, const float* k, float* scores, int64_t T, int64_t pos0,
                    int64_t S, int64_t H, int64_t D);

// Top-K per query row of scores [T, S] over the visible keys s <= pos0 + t.
// sel [T, K]: the chosen positions in ascending position order, -1 padded when fewer than K
// keys are visible (then every visible key is chosen). Ties are broken towards the lower position
// (torch.topk leaves tie order unspecified; with fp32 scores exact ties are rare except all-zero
// ReLU sums). NaN scores rank lowest.
void topk_positions(const float* scores, int32_t* sel, int64_t T, int64_t pos0, int64_t S, int64_t K);

// The indexer module of one layer: weights under `prefix` ("model.layers.N.self_attn.indexer."),
// uploaded to `be`, run with its ops (the same code on both backends).
class DsaIndexer {
 public:
  DsaIndexer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, Backend& be);
  int64_t topk() const { return topk_; }
  int64_t head_dim() const { return D_; }
  int64_t n_heads() const { return H_; }
  // keys: k [T, Di] (act dtype) for x [T, hidden] at positions pos0 .. pos0+T-1 (LayerNorm + RoPE,
  // MXFP8-rounded under --index-quant mxfp8).
  void keys(const DTensor& x, int64_t pos0, const DTensor& k) const;
  // The same for packed documents: rows cu[b] .. cu[b+1] of x are document b from position 0
  // (Backend::rope_varlen); every other step is per row.
  void keys(const DTensor& x, const std::vector<int64_t>& cu, const DTensor& k) const;
  // The same for one row per document at its own position (a decode step): row t at pos[t].
  void keys_rows(const DTensor& x, const std::vector<int64_t>& pos, const DTensor& k) const;
  // select: Top-K sel [T, topk()] I32 (on the backend) for queries x / q_resid [T, ..] at
  // pos0 .. pos0+T-1 over index_k [>= pos0+T, Di].
  void select(const DTensor& x, const DTensor& q_resid, int64_t pos0, const DTensor& index_k, const DTensor& sel) const;

 private:
  Backend* be_;
  int64_t hidden_, q_lora_, H_, D_, rope_dim_, topk_;
  DTensor wq_b_;          // [H*D, q_lora]
  DTensor wk_;            // [D, hidden]
  DTensor k_norm_w_;      // [D] F32
  DTensor k_norm_b_;      // [D] F32
  DTensor weights_proj_;  // [H, hidden]
  // keys() before / after the RoPE (per row).
  void key_rows(const DTensor& x, const DTensor& k) const;
  void key_round(const DTensor& k) const;
  std::unique_ptr<Rope> rope_;  // NeoX over rope_dim (null when rope_dim == 0)
  bool mxfp8_ = false;          // --index-quant mxfp8: queries and keys rounded to MXFP8
};

}  // namespace dz
