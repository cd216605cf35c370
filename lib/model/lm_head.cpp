#include "model/lm_head.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/linalg.hpp"

namespace dz {

LmHead::LmHead(const Tensor& W, int64_t V, int64_t D, const TpShard& tp) : V_(V), D_(D), tp_(tp) {
  auto [a, b] = tp.range_uneven(V);
  v0_ = a;
  v1_ = b;
  W_ = tp.size > 1 ? slice_rows(W, a, b) : W;
}

void LmHead::logits_shard(const float* hidden, int64_t rows, float* out) const {
  linear(hidden, W_.ptr(), nullptr, out, rows, D_, v1_ - v0_);
}

void LmHead::logits_full(const float* hidden, int64_t rows, float* out) const {
  const int64_t n = v1_ - v0_;
  if (tp_.size == 1) return logits_shard(hidden, rows, out);
  std::vector<float> mine(static_cast<size_t>(rows * n));
  logits_shard(hidden, rows, mine.data());
  // Shards arrive in TP-rank order = vocabulary order; re-interleave per row.
  std::vector<float> all = tp_.comm->allgatherv(mine);
  int64_t off = 0;
  for (int r = 0; r < tp_.size; ++r) {
    TpShard o = tp_;
    o.rank = r;
    auto [a, b] = o.range_uneven(V_);
    for (int64_t i = 0; i < rows; ++i)
      std::copy(all.begin() + off + i * (b - a), all.begin() + off + (i + 1) * (b - a), out + i * V_ + a);
    off += rows * (b - a);
  }
}

void LmHead::logprobs(const float* hidden, int64_t rows, const int32_t* target, float* lp) const {
  const int64_t n = v1_ - v0_;
  const int64_t B = 32;  // logits rows at a time: [B, n]
  std::vector<float> lg(static_cast<size_t>(B * n));
  for (int64_t r0 = 0; r0 < rows; r0 += B) {
    const int64_t m = std::min(B, rows - r0);
    logits_shard(hidden + r0 * D_, m, lg.data());
    // per row: global max, sum of exp(x - max) in fp64, the target's logit (from its owner)
    std::vector<float> mx(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) {
      const float* x = &lg[size_t(i * n)];
      float v = -INFINITY;
      for (int64_t j = 0; j < n; ++j) v = x[j] > v ? x[j] : v;
      mx[size_t(i)] = v;
    }
    tp_.comm ? tp_.comm->allreduce_max(mx.data(), m) : void();
    std::vector<double> acc(static_cast<size_t>(2 * m), 0.0);  // [sum exp, target logit]
    for (int64_t i = 0; i < m; ++i) {
      const float* x = &lg[size_t(i * n)];
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(double(x[j]) - mx[size_t(i)]);
      acc[size_t(2 * i)] = s;
      const int64_t t = target[r0 + i];
      if (t >= v0_ && t < v1_) acc[size_t(2 * i + 1)] = double(x[t - v0_]);
    }
    if (tp_.size > 1) tp_.comm->allreduce_sum(acc.data(), 2 * m);
    for (int64_t i = 0; i < m; ++i)
      lp[r0 + i] = float(acc[size_t(2 * i + 1)] - (double(mx[size_t(i)]) + std::log(acc[size_t(2 * i)])));
  }
}

void LmHead::topk(const float* hidden, int64_t rows, int64_t K, int32_t* ids, float* lps) const {
  const int64_t n = v1_ - v0_;
  std::vector<float> lg(static_cast<size_t>(n));
  std::vector<int32_t> idx(static_cast<size_t>(n));
  auto better = [](float va, int32_t ia, float vb, int32_t ib) { return va > vb || (va == vb && ia < ib); };
  for (int64_t r = 0; r < rows; ++r) {
    logits_shard(hidden + r * D_, 1, lg.data());
    // local log-sum-exp pieces and local top-K candidates (by logit: the order of log-probs)
    float mx = -INFINITY;
    for (float v : lg) mx = v > mx ? v : mx;
    float gmx = mx;
    if (tp_.size > 1) tp_.comm->allreduce_max(&gmx, 1);
    double s = 0;
    for (float v : lg) s += std::exp(double(v) - gmx);
    if (tp_.size > 1) tp_.comm->allreduce_sum(&s, 1);
    const double lse = double(gmx) + std::log(s);
    const int64_t k = std::min<int64_t>(K, n);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      return better(lg[size_t(a)], a, lg[size_t(b)], b);
    });
    std::vector<float> cv(static_cast<size_t>(k));
    std::vector<int32_t> ci(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) {
      cv[size_t(j)] = lg[size_t(idx[size_t(j)])];
      ci[size_t(j)] = int32_t(v0_ + idx[size_t(j)]);
    }
    if (tp_.size > 1) {
      cv = tp_.comm->allgatherv(cv);
      ci = tp_.comm->allgatherv(ci);
    }
    std::vector<int64_t> order(cv.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t b) {
      return better(cv[size_t(a)], ci[size_t(a)], cv[size_t(b)], ci[size_t(b)]);
    });
    for (int64_t j = 0; j < K; ++j) {
      ids[r * K + j] = ci[size_t(order[size_t(j)])];
      lps[r * K + j] = float(double(cv[size_t(order[size_t(j)])]) - lse);
    }
  }
}

}  // namespace dz
