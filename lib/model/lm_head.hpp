// The LM head, vocabulary-parallel under TP: each TP rank holds rows [v0, v1) of the output
// matrix and computes that slice of the logits; the log-softmax, top-k and full rows are formed
// with small collectives over the TP group (max, sum of exp, candidate exchange), never by
// gathering [T, V] logits. With tp.size == 1 every function is the plain single-rank computation.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"
#include "model/parallel.hpp"

namespace dz {

class LmHead {
 public:
  LmHead() = default;
  // W [V, D] (the full matrix; only rows [v0, v1) are kept).
  LmHead(const Tensor& W, int64_t V, int64_t D, const TpShard& tp);

  int64_t vocab() const { return V_; }
  int64_t v0() const { return v0_; }
  int64_t v1() const { return v1_; }

  // out[rows, v1 - v0] = this rank's slice of the logits.
  void logits_shard(const float* hidden, int64_t rows, float* out) const;
  // out[rows, V]: the full logits on every TP rank.
  void logits_full(const float* hidden, int64_t rows, float* out) const;
  // lp[r] = log p(target[r] | hidden[r]) (log-softmax over the whole vocabulary).
  void logprobs(const float* hidden, int64_t rows, const int32_t* target, float* lp) const;
  // Top-K (highest log-prob first, lower id first on ties): ids[rows, K], lps[rows, K].
  void topk(const float* hidden, int64_t rows, int64_t K, int32_t* ids, float* lps) const;

 private:
  Tensor W_;  // [v1 - v0, D]
  int64_t V_ = 0, D_ = 0, v0_ = 0, v1_ = 0;
  TpShard tp_;
};

}  // namespace dz
