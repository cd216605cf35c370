// The DSA lightning indexer module of one layer (formulas: ops/indexer.hpp): its weights on a
// backend and the key / Top-K steps written with the backend's ops.
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

// The indexer module of one layer: weights under `prefix` ("model.layers.N.self_attn.indexer."),
// uploaded to `be`, run with its ops (the same code on both backends).
class DsaIndexer {
 public:
  DsaIndexer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, Backend& be);
  // Width of a selection row: index_topk, plus the incomplete group's P − 1 tokens for a k-pool
  // indexer with the tail (GLM-5.3-Flash).
  int64_t topk() const { return topk_ + (P_ > 0 && tail_ ? P_ - 1 : 0); }
  // Per-token cache row: the key, and for a k-pool indexer the key then its pooling gate ([k | g]).
  int64_t cache_width() const { return P_ > 0 ? 2 * D_ : D_; }
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
  int64_t P_ = 0;               // k-pool group size (0: per-token keys)
  bool tail_ = true;            // k-pool: the query's incomplete group is always attended
  DTensor ape_;                 // [P, D] F32: the pooling softmax's per-slot bias
  DTensor gate_w_;              // [D, hidden]: the pooling gate projection
};

}  // namespace dz
