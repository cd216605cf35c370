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

DsaIndexer::DsaIndexer(const ModelConfig& cfg, Checkpoint& ck, const std::string& prefix, Backend& be)
    : be_(&be),
      hidden_(cfg.hidden_size),
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
  const Tensor wq_b = ck.get(prefix + "wq_b.weight", {H_ * D_, q_lora_}, Init::normal(0.02f));
  const Tensor wk = ck.get(prefix + "wk.weight", {D_, hidden_}, Init::normal(0.02f));
  const Tensor nw = ck.get(prefix + "k_norm.weight", {D_}, Init::ones());
  const Tensor nb = ck.get(prefix + "k_norm.bias", {D_}, Init::zeros());
  const Tensor wp = ck.get(prefix + "weights_proj.weight", {H_, hidden_}, Init::normal(0.02f));
  if (rope_dim_ > 0) {
    RopeConfig rc = cfg.rope;
    rc.style = RopeStyle::NeoX;  // the indexer's rope is never interleaved
    rope_ = std::make_unique<Rope>(rc, rope_dim_);
  }
  if (wk.empty()) return;  // dry run (inspect): names and shapes only
  wq_b_ = be.weight(wq_b);
  wk_ = be.weight(wk);
  k_norm_w_ = be.param(nw);
  k_norm_b_ = be.param(nb);
  weights_proj_ = be.weight(wp);
}

void DsaIndexer::key_rows(const DTensor& x, const DTensor& k) const {
  be_->linear(x, wk_, DTensor{}, k);
  be_->layer_norm(k, k_norm_w_, k_norm_b_, k, 1e-6f);
}
void DsaIndexer::key_round(const DTensor& k) const {
  if (mxfp8_) be_->quant_round(k, Backend::Round::Mxfp8);  // each key: D/32 groups with one E8M0 scale each
}

void DsaIndexer::keys(const DTensor& x, int64_t pos0, const DTensor& k) const {
  if (x.rows() == 0) return;
  key_rows(x, k);
  if (rope_) be_->rope(*rope_, k, 1, D_, 0, pos0);
  key_round(k);
}

void DsaIndexer::keys(const DTensor& x, const std::vector<int64_t>& cu, const DTensor& k) const {
  if (x.rows() == 0) return;
  key_rows(x, k);
  if (rope_) be_->rope_varlen(*rope_, k, 1, D_, 0, cu);
  key_round(k);
}

void DsaIndexer::keys_rows(const DTensor& x, const std::vector<int64_t>& pos, const DTensor& k) const {
  if (x.rows() == 0) return;
  key_rows(x, k);
  if (rope_) be_->rope_rows(*rope_, k, 1, D_, 0, pos);
  key_round(k);
}

void DsaIndexer::select(const DTensor& x, const DTensor& q_resid, int64_t pos0, const DTensor& index_k,
                        const DTensor& sel) const {
  const int64_t T = x.rows();
  if (T == 0) return;
  DTensor q = be_->act({T, H_ * D_});  // [T, H, D]
  be_->linear(q_resid, wq_b_, DTensor{}, q);
  if (rope_) be_->rope(*rope_, q, H_, D_, 0, pos0);
  if (mxfp8_) be_->quant_round(q.reshaped({T * H_, D_}), Backend::Round::Mxfp8);  // per token and head
  DTensor w = be_->alloc({T, H_}, DType::F32);  // [T, H]
  be_->linear(x, weights_proj_, DTensor{}, w);
  const float wscale = float(1.0 / std::sqrt(double(H_)) / std::sqrt(double(D_)));
  be_->indexer_topk(q, w, wscale, index_k.slab(0, pos0 + T), pos0, H_, topk_, sel);
}

}  // namespace dz
