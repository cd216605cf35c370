// Speculative decoding with state replay (DESIGN §11): each step drafts up to K tokens per
// document, verifies them in one forward over [current token, drafts], keeps the longest accepted
// prefix and undoes the rest in every layer (Model::spec_keep: attention caches truncate, the
// recurrent states restore). Greedy output equals plain greedy decoding token for token; sampled
// output keeps the model's distribution (rejection sampling against the draft, the residual on
// rejection).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace dz {

// Where a step's draft tokens come from; told every token the document generates.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual void push(int32_t token) = 0;
  virtual std::vector<int32_t> draft(int64_t k) const = 0;  // up to k tokens
};

// The tokens a previous run generated for the document (--speculative oracle: the ceiling of
// speculation, every draft right while this run follows that one), from the current position.
class OracleDrafter : public Drafter {
 public:
  explicit OracleDrafter(std::vector<int32_t> tokens) : t_(std::move(tokens)) {}
  void push(int32_t) override { ++n_; }
  std::vector<int32_t> draft(int64_t k) const override {
    const int64_t a = std::min<int64_t>(n_, int64_t(t_.size()));
    const int64_t e = std::min<int64_t>(a + std::max<int64_t>(k, 0), int64_t(t_.size()));
    return std::vector<int32_t>(t_.begin() + a, t_.begin() + e);
  }

 private:
  std::vector<int32_t> t_;
  int64_t n_ = 0;
};

// Drafts from the document itself (prompt lookup): the longest suffix of the context, of kMaxN
// down to kMinN tokens, that occurred before; the draft is what followed its most recent earlier
// occurrence. An index per n-gram length (hash -> the position after its latest occurrence) is
// updated as tokens arrive, so a draft costs O(kMaxN) lookups whatever the document's length.
class NgramDrafter : public Drafter {
 public:
  static constexpr int kMaxN = 4, kMinN = 2;
  explicit NgramDrafter(const std::vector<int32_t>& prompt);
  void push(int32_t token) override;
  // Up to k tokens (fewer when the match is near the end, none without a match).
  std::vector<int32_t> draft(int64_t k) const override;
  const std::vector<int32_t>& context() const { return ctx_; }

 private:
  uint64_t hash(int64_t end, int n) const;  // of ctx_[end - n, end)
  bool same(int64_t a_end, int64_t b_end, int n) const;
  std::vector<int32_t> ctx_;
  std::unordered_map<uint64_t, int64_t> next_[kMaxN + 1];  // [n]: gram hash -> index of the token after it
};

// Rejection sampling of one draft token d against the model's row (logits / temperature): with
// probability p(d) it is accepted (returns d); else a token from p with d removed, renormalised
// (the residual max(0, p - q) for a draft distribution q that is all on d). u in [0, 1): the
// uniform of the acceptance test, w in [0, 1) of the residual draw. Deterministic in (u, w).
int32_t accept_or_resample(const float* logits, int64_t V, double temperature, int32_t d, double u, double w,
                           bool* accepted);

// The uniforms of step `index` of document `doc` (index = how many tokens the document had generated
// before the token being decided), from the run's seed: independent of ranks and batching.
double spec_uniform(uint64_t seed, int64_t doc, int64_t index, int which);

}  // namespace dz
