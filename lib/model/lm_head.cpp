#include "model/lm_head.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.hpp"

namespace dz {

LmHead::LmHead(const Tensor& W, int64_t V, int64_t D, const TpShard& tp, Backend& be)
    : be_(&be), V_(V), D_(D), tp_(tp) {
  auto [a, b] = tp.range_uneven(V);
  v0_ = a;
  v1_ = b;
  const Tensor mine = tp.size > 1 ? slice_rows(W, a, b) : W;
  if (!mine.empty()) W_ = be.weight(mine);  // dry run (inspect): shapes only
}

DTensor LmHead::shard_logits(const DTensor& hidden, int64_t r0, int64_t m) const {
  DTensor lg = be_->alloc({m, v1_ - v0_}, DType::F32);
  be_->linear(hidden.reshaped({hidden.numel() / D_, D_}).slab(r0, r0 + m), W_, DTensor{}, lg);
  return lg;
}

void LmHead::logits_full(const DTensor& hidden, float* out) const {
  const int64_t rows = hidden.numel() / D_, n = v1_ - v0_;
  if (tp_.size == 1) {  // straight into the caller's rows: no host copy after the device's last step
    if (rows) be_->download(shard_logits(hidden, 0, rows), out);
    return;
  }
  std::vector<float> mine(static_cast<size_t>(rows * n));
  if (rows) be_->download(shard_logits(hidden, 0, rows), mine.data());
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

LmHead::Chunk LmHead::chunk(const DTensor& hidden, int64_t r0, int64_t m, const int32_t* target) const {
  Chunk c;
  c.logits = shard_logits(hidden, r0, m);
  const std::vector<int32_t> t = target ? std::vector<int32_t>(target + r0, target + r0 + m)
                                        : std::vector<int32_t>(size_t(m), -1);
  std::vector<double> p;  // [m, 3]: this shard's max, sum exp(logit - max), target logit
  be_->lse_parts(c.logits, t, v0_, p);
  c.mx.resize(size_t(m));
  c.acc.resize(size_t(2 * m));
  for (int64_t i = 0; i < m; ++i) c.mx[size_t(i)] = float(p[size_t(3 * i)]);
  if (tp_.size > 1) tp_.comm->allreduce_max(c.mx.data(), m);
  for (int64_t i = 0; i < m; ++i) {
    // the shard's sum moved to the row's max: S = sum_r s_r exp(m_r - M) (an empty shard or one
    // whose logits are all -inf adds nothing; with one shard m_r == M and the sum is kept as it is)
    const double mr = p[size_t(3 * i)], M = c.mx[size_t(i)], s = p[size_t(3 * i + 1)];
    c.acc[size_t(2 * i)] = mr == M ? s : mr == -INFINITY ? 0.0 : s * std::exp(mr - M);
    c.acc[size_t(2 * i + 1)] = p[size_t(3 * i + 2)];
  }
  if (tp_.size > 1) tp_.comm->allreduce_sum(c.acc.data(), 2 * m);
  return c;
}

void LmHead::logprobs(const DTensor& hidden, const int32_t* target, float* lp, uint8_t* greedy) const {
  const int64_t rows = hidden.numel() / D_;
  const int64_t B = be_->lm_rows_per_chunk(v1_ - v0_);  // logits rows at a time: [B, n]
  std::vector<int32_t> best;
  for (int64_t r0 = 0; r0 < rows; r0 += B) {
    const int64_t m = std::min(B, rows - r0);
    const Chunk c = chunk(hidden, r0, m, target);
    for (int64_t i = 0; i < m; ++i)
      lp[r0 + i] = float(c.acc[size_t(2 * i + 1)] - (double(c.mx[size_t(i)]) + std::log(c.acc[size_t(2 * i)])));
    if (greedy) {
      best.resize(size_t(m));
      argmax(c.logits, r0, m, best.data());
      for (int64_t i = 0; i < m; ++i) greedy[r0 + i] = best[size_t(i)] == target[r0 + i];
    }
  }
}

void LmHead::topk(const DTensor& hidden, int64_t K, int32_t* ids, float* lps) const {
  const int64_t rows = hidden.numel() / D_, n = v1_ - v0_;
  auto better = [](float va, int32_t ia, float vb, int32_t ib) { return va > vb || (va == vb && ia < ib); };
  const int64_t B = be_->lm_rows_per_chunk(n);
  for (int64_t r0 = 0; r0 < rows; r0 += B) {
    const int64_t m = std::min(B, rows - r0);
    const Chunk c = chunk(hidden, r0, m, nullptr);
    // local top-K candidates (by logit: the order of log-probs), merged over the TP group per row
    std::vector<int32_t> lid;
    std::vector<float> lval;
    const int64_t k = std::min<int64_t>(K, n);
    be_->row_topk(c.logits, k, lid, lval);
    for (int64_t i = 0; i < m; ++i) {
      const double lse = double(c.mx[size_t(i)]) + std::log(c.acc[size_t(2 * i)]);
      std::vector<float> cv(lval.begin() + i * k, lval.begin() + (i + 1) * k);
      std::vector<int32_t> ci(lid.begin() + i * k, lid.begin() + (i + 1) * k);
      for (auto& x : ci) x = int32_t(v0_ + x);
      if (tp_.size > 1) {
        cv = tp_.comm->allgatherv(cv);
        ci = tp_.comm->allgatherv(ci);
      }
      std::vector<int64_t> order(cv.size());
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t b) {
        return better(cv[size_t(a)], ci[size_t(a)], cv[size_t(b)], ci[size_t(b)]);
      });
      const int64_t r = r0 + i;
      for (int64_t j = 0; j < K; ++j) {
        ids[r * K + j] = ci[size_t(order[size_t(j)])];
        lps[r * K + j] = float(double(cv[size_t(order[size_t(j)])]) - lse);
      }
    }
  }
}

void LmHead::argmax(const DTensor& logits, int64_t r0, int64_t m, int32_t* ids) const {
  const int64_t n = v1_ - v0_;
  auto better = [](float va, int32_t ia, float vb, int32_t ib) { return va > vb || (va == vb && ia < ib); };
  // this shard's best (logit, id) per row; an empty shard offers none
  std::vector<int32_t> ci(size_t(m), std::numeric_limits<int32_t>::max());
  std::vector<float> cv(size_t(m), -std::numeric_limits<float>::infinity());
  if (n > 0) {
    be_->row_topk(logits, 1, ci, cv);
    for (auto& x : ci) x = int32_t(v0_ + x);
  }
  if (tp_.size > 1) {  // [tp, m] in rank order
    cv = tp_.comm->allgatherv(cv);
    ci = tp_.comm->allgatherv(ci);
  }
  for (int64_t i = 0; i < m; ++i) {
    int32_t bi = std::numeric_limits<int32_t>::max();
    float bv = -std::numeric_limits<float>::infinity();
    for (size_t j = size_t(i); j < cv.size(); j += size_t(m))
      if (ci[j] >= 0 && ci[j] < V_ && (bi == std::numeric_limits<int32_t>::max() || better(cv[j], ci[j], bv, bi)))
        bv = cv[j], bi = ci[j];
    DZ_CHECK(bi >= 0 && bi < V_ && !std::isnan(bv), "LM head: row ", r0 + i, " has no logit that is a number (NaN weights or ",
             "activations?)");
    ids[i] = bi;
  }
}

void LmHead::greedy(const DTensor& hidden, int32_t* ids) const {
  const int64_t rows = hidden.numel() / D_;
  const int64_t B = be_->lm_rows_per_chunk(v1_ - v0_);
  for (int64_t r0 = 0; r0 < rows; r0 += B) {
    const int64_t m = std::min(B, rows - r0);
    argmax(v1_ > v0_ ? shard_logits(hidden, r0, m) : DTensor{}, r0, m, ids + r0);
  }
}

DTensor LmHead::host_in(const float* hidden, int64_t rows) const {
  DZ_CHECK(be_->device() == Device::Host, "LmHead: host input on the ", be_->name(), " backend");
  return host_view(const_cast<float*>(hidden), {rows, D_});
}
void LmHead::logits_full(const float* hidden, int64_t rows, float* out) const { logits_full(host_in(hidden, rows), out); }
void LmHead::logprobs(const float* hidden, int64_t rows, const int32_t* target, float* lp) const {
  logprobs(host_in(hidden, rows), target, lp);
}
void LmHead::topk(const float* hidden, int64_t rows, int64_t K, int32_t* ids, float* lps) const {
  topk(host_in(hidden, rows), K, ids, lps);
}

}  // namespace dz
