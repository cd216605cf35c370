// The LM head, vocabulary-parallel under TP: each TP rank holds rows [v0, v1) of the output
// matrix and computes that slice of the logits; the log-softmax, top-k and full rows are formed
// with small collectives over the TP group (max, sum of exp, candidate exchange), never by
// gathering [T, V] logits. Logits exist only per chunk of rows (Backend::lm_rows_per_chunk) on the
// backend, fp32: a whole T × V logits tensor is never materialised. With tp.size == 1 every
// function is the plain single-rank computation.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "core/tensor.hpp"
#include "model/parallel.hpp"

namespace dz {

class LmHead {
 public:
  LmHead() = default;
  // W [V, D] (the full matrix; only rows [v0, v1) are kept, uploaded to `be`).
  LmHead(const Tensor& W, int64_t V, int64_t D, const TpShard& tp, Backend& be);

  int64_t vocab() const { return V_; }
  int64_t v0() const { return v0_; }
  int64_t v1() const { return v1_; }

  // hidden [rows, D] (act dtype, on the backend) -> host results.
  // out[rows, V]: the full logits on every TP rank.
  void logits_full(const DTensor& hidden, float* out) const;
  // lp[r] = log p(target[r] | hidden[r]) (log-softmax over the whole vocabulary); greedy
  // (optional): greedy[r] = 1 when target[r] is the row's argmax (the lower id on ties, as greedy
  // decoding and torch's argmax choose), else 0.
  void logprobs(const DTensor& hidden, const int32_t* target, float* lp, uint8_t* greedy = nullptr) const;
  // Top-K (highest log-prob first, lower id first on ties): ids[rows, K], lps[rows, K].
  void topk(const DTensor& hidden, int64_t K, int32_t* ids, float* lps) const;
  // ids[rows]: per row the id of the largest logit, the lower id on ties (greedy decoding's
  // choice: only the ids leave the backend, not the [rows, V] logits). A row without a number
  // (every logit NaN) is refused.
  void greedy(const DTensor& hidden, int32_t* ids) const;

  // Host fp32 conveniences (CPU backend: tools, tests).
  void logits_full(const float* hidden, int64_t rows, float* out) const;
  void logprobs(const float* hidden, int64_t rows, const int32_t* target, float* lp) const;
  void topk(const float* hidden, int64_t rows, int64_t K, int32_t* ids, float* lps) const;

 private:
  DTensor shard_logits(const DTensor& hidden, int64_t r0, int64_t m) const;  // [m, v1 - v0] F32
  // Rows [r0, r0 + m): this shard's logits, the row maxima over the whole vocabulary, and per row
  // [sum of exp(logit - max) over the whole vocabulary, the target's logit] in fp64 (target
  // nullptr: no targets), reduced over the TP group.
  struct Chunk {
    DTensor logits;
    std::vector<float> mx;
    std::vector<double> acc;  // [m, 2]
  };
  Chunk chunk(const DTensor& hidden, int64_t r0, int64_t m, const int32_t* target) const;
  DTensor host_in(const float* hidden, int64_t rows) const;
  // ids[m]: the argmax over the whole vocabulary of rows [r0, r0 + m) from this shard's logits
  // [m, v1 - v0] (the lower id on ties), merged over the TP group.
  void argmax(const DTensor& logits, int64_t r0, int64_t m, int32_t* ids) const;

  Backend* be_ = nullptr;
  DTensor W_;  // [v1 - v0, D]
  int64_t V_ = 0, D_ = 0, v0_ = 0, v1_ = 0;
  TpShard tp_;
};

}  // namespace dz
