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

namespace {
// Top-K order over a score row: higher score first; NaN last; equal scores: lower position first.
struct Better {
  const float* row;
  bool operator()(int32_t a, int32_t b) const {
    const float x = row[a], y = row[b];
    const bool xn = std::isnan(x), yn = std::isnan(y);
    if (xn != yn) return yn;
    if (!xn && x != y) return x > y;
    return a < b;
  }
};
}  // namespace

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
      std::nth_element(idx.begin(), idx.begin() + (K - 1), idx.end(), Better{row});
      idx.resize(size_t(K));
    }
    std::sort(idx.begin(), idx.end());
    const int64_t m = int64_t(idx.size());
    for (int64_t j = 0; j < K; ++j) out[j] = j < m ? idx[size_t(j)] : -1;
  }
}

void kpool_pooled_keys(const float* cache, const float* ape, int64_t S, int64_t D, int64_t P, float* kp) {
  const int64_t NP = S / P;
  std::vector<float> e(static_cast<size_t>(P));
  for (int64_t p = 0; p < NP; ++p)
    for (int64_t c = 0; c < D; ++c) {
      float mx = -INFINITY;
      for (int64_t j = 0; j < P; ++j) {
        e[size_t(j)] = cache[(p * P + j) * 2 * D + D + c] + ape[j * D + c];
        mx = std::max(mx, e[size_t(j)]);
      }
      float sum = 0.f, acc = 0.f;
      for (int64_t j = 0; j < P; ++j) sum += (e[size_t(j)] = std::exp(e[size_t(j)] - mx));
      for (int64_t j = 0; j < P; ++j) acc += e[size_t(j)] / sum * cache[(p * P + j) * 2 * D + c];
      kp[p * D + c] = acc;
    }
}

void group_select(const float* q, const float* w, const float* keys, int64_t T, int64_t pos0, int64_t NG, int64_t H,
                  int64_t D, int64_t P, int64_t K, int32_t* sel) {
  DZ_CHECK(P > 0 && K > 0, "group_select: group ", P, ", groups per query ", K);
  DZ_CHECK((pos0 + T) / P <= NG, "group_select: rows reach group ", (pos0 + T) / P - 1, " beyond ", NG, " groups");
  std::vector<float> sc(static_cast<size_t>(std::max<int64_t>(NG, 1)));
  std::vector<int32_t> idx;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = pos0 + t, nvis = (s + 1) / P;
    const float* qt = q + t * H * D;
    for (int64_t p = 0; p < nvis; ++p) {
      float v = 0.f;
      for (int64_t h = 0; h < H; ++h) {
        float d = 0.f;
        for (int64_t c = 0; c < D; ++c) d += qt[h * D + c] * keys[p * D + c];
        v += w[t * H + h] * std::max(d, 0.f);
      }
      sc[size_t(p)] = v;
    }
    idx.resize(size_t(nvis));
    std::iota(idx.begin(), idx.end(), 0);
    if (nvis > K) {
      std::nth_element(idx.begin(), idx.begin() + (K - 1), idx.end(), Better{sc.data()});
      idx.resize(size_t(K));
    }
    std::sort(idx.begin(), idx.end());
    for (int64_t j = 0; j < K; ++j) sel[t * K + j] = j < int64_t(idx.size()) ? idx[size_t(j)] : -1;
  }
}

void kpool_select(const float* q, const float* w, const float* kp, int64_t T, int64_t pos0, int64_t S, int64_t H,
                  int64_t D, int64_t P, int64_t Kp, bool tail, int32_t* sel) {
  DZ_CHECK(P > 0 && Kp > 0, "kpool_select: group ", P, ", groups per query ", Kp);
  DZ_CHECK(pos0 + T <= S, "kpool_select: rows reach position ", pos0 + T - 1, " beyond ", S, " keys");
  const int64_t NP = S / P, width = Kp * P + (tail ? P - 1 : 0);
  std::vector<int32_t> groups(static_cast<size_t>(T * Kp));
  group_select(q, w, kp, T, pos0, NP, H, D, P, Kp, groups.data());
  for (int64_t t = 0; t < T; ++t) {
    const int64_t s = pos0 + t, nvis = (s + 1) / P;
    int32_t* out = sel + t * width;
    int64_t n = 0;
    for (int64_t j = 0; j < Kp && groups[size_t(t * Kp + j)] >= 0; ++j)
      for (int64_t i = 0; i < P; ++i) out[n++] = int32_t(groups[size_t(t * Kp + j)] * P + i);
    if (tail)
      for (int64_t u = nvis * P; u <= s; ++u) out[n++] = int32_t(u);
    for (; n < width; ++n) out[n] = -1;
  }
}

}  // namespace dz
