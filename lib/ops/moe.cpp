// Mixture-of-experts router and SwiGLU experts (CPU reference). Semantics: see moe.hpp.
#include "ops/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.hpp"
#include "core/linalg.hpp"

namespace dz {

void RouterConfig::validate() const {
  DZ_CHECK(n_experts > 0, "moe router: n_routed_experts must be positive, got ", n_experts);
  DZ_CHECK(top_k > 0 && top_k <= n_experts, "moe router: num_experts_per_tok ", top_k, " not in [1, ", n_experts,
           "]");
  DZ_CHECK(n_group > 0 && n_experts % n_group == 0, "moe router: n_group ", n_group, " does not divide ", n_experts,
           " experts");
  DZ_CHECK(topk_group > 0, "moe router: topk_group must be positive, got ", topk_group);
  const int64_t gs = n_experts / n_group;
  if (topk_group < n_group) {  // group limiting is active
    DZ_CHECK(group_score != GroupScore::Top2Sum || gs >= 2, "moe router: top-2 group scores need >= 2 experts per group, got ",
             gs);
    DZ_CHECK(top_k <= topk_group * gs, "moe router: num_experts_per_tok ", top_k, " exceeds the ", topk_group * gs,
             " experts of the kept groups");
  }
}

namespace {
// Indices [0, n) ordered by descending v; equal values keep ascending index (stable).
void order_desc(const float* v, int64_t n, std::vector<int32_t>& ord) {
  ord.resize(size_t(n));
  std::iota(ord.begin(), ord.end(), 0);
  std::stable_sort(ord.begin(), ord.end(), [v](int32_t a, int32_t b) { return v[a] > v[b]; });
}
}  // namespace

void moe_select(const RouterConfig& rc, const float* logits, const float* bias, int32_t* idx, float* w,
                const int32_t* fixed) {
  const int64_t E = rc.n_experts;
  std::vector<float> s(static_cast<size_t>(E)), c(static_cast<size_t>(E));  // scores [E], selection scores [E]
  if (rc.score_func == ScoreFunc::Softmax) {
    float mx = logits[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
    float sum = 0.f;
    for (int64_t e = 0; e < E; ++e) sum += (s[size_t(e)] = std::exp(logits[e] - mx));
    for (int64_t e = 0; e < E; ++e) s[size_t(e)] /= sum;
  } else if (rc.score_func == ScoreFunc::Sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[size_t(e)] = sigmoid(logits[e]);
  } else {  // sqrt(softplus(x)), softplus as torch computes it (x itself above 20)
    for (int64_t e = 0; e < E; ++e) {
      const float x = logits[e];
      s[size_t(e)] = std::sqrt(x > 20.f ? x : std::log1p(std::exp(x)));
    }
  }
  if (fixed) {
    std::vector<int32_t> f(fixed, fixed + rc.top_k);
    std::sort(f.begin(), f.end());
    float sum = 0.f;
    for (int64_t j = 0; j < rc.top_k; ++j) {
      DZ_CHECK(f[size_t(j)] >= 0 && f[size_t(j)] < E, "moe router: hash-routed expert ", f[size_t(j)], " outside 0..", E - 1);
      idx[j] = f[size_t(j)];
      w[j] = s[size_t(f[size_t(j)])];
      DZ_CHECK(std::isfinite(w[j]), "moe router: score of expert ", idx[j], " is not finite (", w[j], ")");
      sum += w[j];
    }
    for (int64_t j = 0; j < rc.top_k; ++j) w[j] = (rc.norm_topk_prob ? w[j] / (sum + 1e-20f) : w[j]) * rc.routed_scaling_factor;
    return;
  }
  for (int64_t e = 0; e < E; ++e) {
    c[size_t(e)] = bias ? s[size_t(e)] + bias[e] : s[size_t(e)];
    DZ_CHECK(std::isfinite(c[size_t(e)]), "moe router: score of expert ", e, " is not finite (", c[size_t(e)], ")");
  }

  // Group limiting: experts outside the kept groups drop out of the candidate set.
  std::vector<int32_t> cand;  // candidate experts, ascending
  const int64_t G = rc.n_group, gs = E / G;
  if (rc.topk_group < G) {
    std::vector<float> gscore(static_cast<size_t>(G));
    for (int64_t g = 0; g < G; ++g) {
      const float* cg = c.data() + g * gs;
      float best = -INFINITY, second = -INFINITY;
      for (int64_t i = 0; i < gs; ++i) {
        if (cg[i] > best) {
          second = best;
          best = cg[i];
        } else if (cg[i] > second) {
          second = cg[i];
        }
      }
      gscore[size_t(g)] = rc.group_score == GroupScore::Top2Sum ? best + second : best;
    }
    std::vector<int32_t> gord;
    order_desc(gscore.data(), G, gord);
    std::vector<char> keep(size_t(G), 0);
    for (int64_t j = 0; j < rc.topk_group; ++j) keep[size_t(gord[size_t(j)])] = 1;
    for (int64_t e = 0; e < E; ++e)
      if (keep[size_t(e / gs)]) cand.push_back(int32_t(e));
  } else {
    cand.resize(size_t(E));
    std::iota(cand.begin(), cand.end(), 0);
  }

  std::stable_sort(cand.begin(), cand.end(), [&c](int32_t a, int32_t b) { return c[size_t(a)] > c[size_t(b)]; });
  std::sort(cand.begin(), cand.begin() + rc.top_k);  // picked experts in ascending index
  float sum = 0.f;
  for (int64_t j = 0; j < rc.top_k; ++j) {
    idx[j] = cand[size_t(j)];
    w[j] = s[size_t(cand[size_t(j)])];  // unbiased score
    sum += w[j];
  }
  if (rc.norm_topk_prob)
    for (int64_t j = 0; j < rc.top_k; ++j) w[j] /= (sum + 1e-20f);
  for (int64_t j = 0; j < rc.top_k; ++j) w[j] *= rc.routed_scaling_factor;
}

void moe_route(const RouterConfig& rc, const float* x, const float* W_gate, const float* bias, int64_t T, int64_t D,
               int32_t* idx, float* w, const int32_t* fixed) {
  rc.validate();
  const int64_t E = rc.n_experts;
  std::vector<float> logits(static_cast<size_t>(T * E));  // [T, E]
  linear(x, W_gate, nullptr, logits.data(), T, D, E);
  for (int64_t t = 0; t < T; ++t)
    moe_select(rc, logits.data() + t * E, bias, idx + t * rc.top_k, w + t * rc.top_k,
               fixed ? fixed + t * rc.top_k : nullptr);
}

SwigluView SwigluView::slice(int64_t i0, int64_t i1, int64_t D) const {
  DZ_CHECK(0 <= i0 && i0 < i1 && i1 <= inter, "swiglu slice [", i0, ", ", i1, ") outside [0, ", inter, ")");
  SwigluView v;
  v.gate = gate + i0 * D;
  v.up = up + i0 * D;
  v.down = down + i0;
  v.inter = i1 - i0;
  v.down_ld = down_ld;
  v.act = act;
  return v;
}

namespace {
// a[T, I] = act(x·gate^T, x·up^T); returns down as a contiguous [D, I] pointer (copied into
// dbuf when it is a column slice).
const float* swiglu_hidden(const SwigluView& m, const float* x, int64_t T, int64_t D, std::vector<float>& a,
                           std::vector<float>& dbuf) {
  const int64_t I = m.inter;
  DZ_CHECK(I > 0 && m.down_ld >= I, "swiglu: bad width ", I, " / down row stride ", m.down_ld);
  std::vector<float> u(static_cast<size_t>(T * I));
  a.resize(size_t(T * I));
  linear(x, m.gate, nullptr, a.data(), T, D, I);
  linear(x, m.up, nullptr, u.data(), T, D, I);
  for (size_t i = 0; i < a.size(); ++i) a[i] = glu_act(m.act, a[i], u[i]);
  if (m.down_ld == I) return m.down;
  dbuf.resize(size_t(D * I));
  for (int64_t r = 0; r < D; ++r) std::copy(m.down + r * m.down_ld, m.down + r * m.down_ld + I, dbuf.data() + r * I);
  return dbuf.data();
}
}  // namespace

void swiglu_mlp(const SwigluView& m, const float* x, float* y, int64_t T, int64_t D) {
  std::vector<float> a, dbuf;
  const float* down = swiglu_hidden(m, x, T, D, a, dbuf);
  linear(a.data(), down, nullptr, y, T, m.inter, D);
}

void swiglu_mlp_acc(const SwigluView& m, const float* x, float* y, int64_t T, int64_t D) {
  std::vector<float> a, dbuf;
  const float* down = swiglu_hidden(m, x, T, D, a, dbuf);
  linear_acc(a.data(), down, y, T, m.inter, D);
}

void moe_experts_acc(const std::vector<SwigluView>& experts, const float* x, int64_t T, int64_t D,
                     const int32_t* idx, const float* w, int64_t top_k, int64_t e0, int64_t e1, float* out) {
  DZ_CHECK(0 <= e0 && e0 <= e1 && e1 <= int64_t(experts.size()), "moe experts: range [", e0, ", ", e1,
           ") outside [0, ", experts.size(), ")");
  // Token lists per expert in the range, in token order.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(e1 - e0));  // (t * top_k + j) entries
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = idx[t * top_k + j];
      DZ_CHECK(e >= 0 && e < int64_t(experts.size()), "moe experts: expert index ", e, " out of range");
      if (e >= e0 && e < e1) rows[size_t(e - e0)].push_back(t * top_k + j);
    }
  // Experts run in ascending order and each adds to out[t] once, so every token's sum is taken
  // in ascending expert order whatever T is.
  std::vector<float> xe, ye;
  for (int64_t e = e0; e < e1; ++e) {
    const auto& r = rows[size_t(e - e0)];
    if (r.empty()) continue;
    const int64_t n = int64_t(r.size());
    xe.resize(size_t(n * D));
    ye.resize(size_t(n * D));
    for (int64_t i = 0; i < n; ++i) std::copy(x + (r[size_t(i)] / top_k) * D, x + (r[size_t(i)] / top_k + 1) * D,
                                              xe.data() + i * D);
    swiglu_mlp(experts[size_t(e)], xe.data(), ye.data(), n, D);
    for (int64_t i = 0; i < n; ++i) {
      const float wt = w[r[size_t(i)]];
      float* o = out + (r[size_t(i)] / top_k) * D;
      const float* yi = ye.data() + i * D;
      for (int64_t d = 0; d < D; ++d) o[d] += wt * yi[d];
    }
  }
}

}  // namespace dz
