// DSA lightning indexer + Top-K (CPU reference). See indexer.hpp for the formulas and how they
// relate to DeepSeek's inference code.
#include "ops/indexer.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.hpp"
#include "core/fp8.hpp"
#include "core/linalg.hpp"

namespace dz {

void layer_norm(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t D, float eps) {
  DZ_CHECK(D > 0 && rows >= 0, "layer_norm: bad shape [", rows, ", ", D, "]");
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;  // [D]
    float* yr = y + r * D;
    float mean = 0.f;
    for (int64_t i = 0; i < D; ++i) mean += xr[i];
    mean /= float(D);
    float var = 0.f;
    for (int64_t i = 0; i < D; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= float(D);
    const float inv = 1.f / std::sqrt(var + eps);
    for (int64_t i = 0; i < D; ++i) {
      float n = (xr[i] - mean) * inv;
      if (w) n *= w[i];
      if (b) n += b[i];
      yr[i] = n;
    }
  }
}

void indexer_scores(const float* q, const float* w, const float* k, float* scores, int64_t T, int64_t pos0,
                    int64_t S, int64_t H, int64_t D) {
  DZ_CHECK(T >= 0 && pos0 >= 0 && pos0 + T <= S, "indexer_scores: queries at ", pos0, "..", pos0 + T - 1,
           " need at least ", pos0 + T, " keys, got ", S);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t last = pos0 + t;
    float* row = scores + t * S;  // [S]
    for (int64_t s = 0; s <= last; ++s) {
      const float* ks = k + s * D;
      float acc = 0.f;
      for (int64_t h = 0; h < H; ++h) {
        const float d = dot(q + (t * H + h) * D, ks, D);
        if (d > 0.f) acc += w[t * H + h] * d;
      }
      row[s] = acc;
    }
    for (int64_t s = last + 1; s < S; ++s) row[s] = ninf;
  }
}

void topk_positions(const float* scores, int32_t* sel, int64_t T, int64_t pos0, int64_t S, int64_t K) {
  DZ_CHECK(K > 0, "topk_positions: K must be positive, got ", K);
  DZ_CHECK(pos0 + T <= S, "topk_positions: rows reach position ", pos0 + T - 1, " beyond ", S, " keys");
  DZ_CHECK(S <= int64_t(std::numeric_limits<int32_t>::max()), "topk_positions: ", S, " keys overflow int32");
  std::vector<int32_t> idx;
  for (int64_t t = 0; t < T; ++t) {
    const float* row = scores + t * S;
    const int64_t n = pos0 + t + 1;  // visible keys
    int32_t* out = sel + t * K;
    idx.resize(size_t(n));
    std::iota(idx.begin(), idx.end(), 0);
    if (n > K) {
      // Higher score first; NaN last; equal scores: lower position first.
      auto better = [row](int32_t a, int32_t b) {
        const float x = row[a], y = row[b];
        const bool xn = std::isnan(x), yn = std::isnan(y);
        if (xn != yn) return yn;
        if (!xn && x != y) return x > y;
        return a < b;
      };
      std::nth_element(idx.begin(), idx.begin() + (K - 1), idx.end(), better);
      idx.resize(size_t(K));
    }
    std::sort(idx.begin(), idx.end());
    const int64_t m = int64_t(idx.size());
    for (int64_t j = 0; j < K; ++j) out[j] = j < m ? idx[size_t(j)] : -1;
  }
}

DsaIndexer::DsaIndexer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix)
    : hidden_(cfg.hidden_size),
      q_lora_(cfg.q_lora_rank),
      H_(cfg.index_n_heads),
      D_(cfg.index_head_dim),
      rope_dim_(cfg.qk_rope_head_dim),
      topk_(cfg.index_topk),
      mxfp8_(cfg.index_mxfp8) {
  DZ_CHECK(q_lora_ > 0, prefix, ": the DSA indexer reads the q latent, so q_lora_rank must be > 0");
  DZ_CHECK(H_ > 0 && D_ > 0 && topk_ > 0, prefix, ": index_n_heads, index_head_dim and index_topk must be > 0");
  DZ_CHECK(rope_dim_ >= 0 && rope_dim_ <= D_ && rope_dim_ % 2 == 0, prefix, ": qk_rope_head_dim ", rope_dim_,
           " must be even and fit index_head_dim ", D_);
  wq_b_ = ck.get(prefix + "wq_b.weight", {H_ * D_, q_lora_}, Init::normal(0.02f));
  wk_ = ck.get(prefix + "wk.weight", {D_, hidden_}, Init::normal(0.02f));
  k_norm_w_ = ck.get(prefix + "k_norm.weight", {D_}, Init::ones());
  k_norm_b_ = ck.get(prefix + "k_norm.bias", {D_}, Init::zeros());
  weights_proj_ = ck.get(prefix + "weights_proj.weight", {H_, hidden_}, Init::normal(0.02f));
  if (rope_dim_ > 0) {
    RopeConfig rc = cfg.rope;
    rc.style = RopeStyle::NeoX;  // the indexer's rope is never interleaved
    rope_ = std::make_unique<Rope>(rc, rope_dim_);
  }
}

void DsaIndexer::forward(const float* x, const float* q_resid, int64_t T, int64_t pos0, std::vector<float>& index_k,
                         int32_t* sel) const {
  DZ_CHECK(int64_t(index_k.size()) == pos0 * D_, "indexer: key cache holds ", index_k.size() / size_t(D_),
           " rows, expected ", pos0);
  index_k.resize(size_t((pos0 + T) * D_));
  keys(x, T, pos0, index_k.data() + pos0 * D_);
  select(x, q_resid, T, pos0, index_k.data(), sel);
}

void DsaIndexer::keys(const float* x, int64_t T, int64_t pos0, float* k) const {
  if (T == 0) return;
  linear(x, wk_.ptr(), nullptr, k, T, hidden_, D_);
  layer_norm(k, k_norm_w_.ptr(), k_norm_b_.ptr(), k, T, D_, 1e-6f);
  if (rope_) rope_->apply(k, T, 1, D_, 0, pos0);
  if (mxfp8_) mxfp8_round(k, T, D_, k);  // each key: D/32 groups with one E8M0 scale each
}

void DsaIndexer::select(const float* x, const float* q_resid, int64_t T, int64_t pos0, const float* index_k,
                        int32_t* sel) const {
  if (T == 0) return;
  const int64_t S = pos0 + T;
  std::vector<float> q(size_t(T * H_ * D_));  // [T, H, D]
  linear(q_resid, wq_b_.ptr(), nullptr, q.data(), T, q_lora_, H_ * D_);
  if (rope_) rope_->apply(q.data(), T, H_, D_, 0, pos0);
  if (mxfp8_) mxfp8_round(q.data(), T * H_, D_, q.data());  // per token and head
  std::vector<float> w(size_t(T * H_));  // [T, H]
  linear(x, weights_proj_.ptr(), nullptr, w.data(), T, hidden_, H_);
  const float wscale = float(1.0 / std::sqrt(double(H_)) / std::sqrt(double(D_)));
  for (float& v : w) v *= wscale;
  // Score in blocks of query rows so prefill memory stays at rows × S.
  const int64_t block = 64;
  std::vector<float> scores;
  for (int64_t t0 = 0; t0 < T; t0 += block) {
    const int64_t n = std::min(block, T - t0);
    scores.resize(size_t(n * S));
    indexer_scores(q.data() + t0 * H_ * D_, w.data() + t0 * H_, index_k, scores.data(), n, pos0 + t0, S, H_, D_);
    topk_positions(scores.data(), sel + t0 * topk_, n, pos0 + t0, S, topk_);
  }
}

}  // namespace dz
