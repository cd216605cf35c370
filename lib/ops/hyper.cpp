#include "ops/hyper.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/linalg.hpp"

namespace dz {

namespace {
float sigmoidf(float v) { return 1.f / (1.f + std::exp(-v)); }
}  // namespace

void hc_coeffs(const float* m, const float* base, const float* scale, const HcParams& p, float* coeff) {
  const int64_t N = p.N;
  float* pre = coeff;
  float* post = coeff + N;
  float* comb = coeff + 2 * N;  // [N, N]: row n = input stream, column = output stream
  for (int64_t n = 0; n < N; ++n) {
    pre[n] = sigmoidf(m[n] * scale[0] + base[n]) + p.eps_hc;
    post[n] = 2.f * sigmoidf(m[N + n] * scale[1] + base[N + n]);
  }
  for (int64_t r = 0; r < N; ++r) {  // softmax over each row (the last dim)
    float* row = comb + r * N;
    float mx = -INFINITY;
    for (int64_t c = 0; c < N; ++c) {
      row[c] = m[2 * N + r * N + c] * scale[2] + base[2 * N + r * N + c];
      mx = std::max(mx, row[c]);
    }
    float s = 0.f;
    for (int64_t c = 0; c < N; ++c) s += (row[c] = std::exp(row[c] - mx));
    for (int64_t c = 0; c < N; ++c) row[c] = row[c] / s + p.eps_hc;
  }
  auto cols = [&] {
    for (int64_t c = 0; c < N; ++c) {
      float s = 0.f;
      for (int64_t r = 0; r < N; ++r) s += comb[r * N + c];
      for (int64_t r = 0; r < N; ++r) comb[r * N + c] /= s + p.eps_hc;
    }
  };
  cols();
  for (int it = 0; it + 1 < p.iters; ++it) {
    for (int64_t r = 0; r < N; ++r) {
      float s = 0.f;
      for (int64_t c = 0; c < N; ++c) s += comb[r * N + c];
      for (int64_t c = 0; c < N; ++c) comb[r * N + c] /= s + p.eps_hc;
    }
    cols();
  }
}

void hc_pre(const float* x, const float* fn, const float* base, const float* scale, const HcParams& p, int64_t T,
            int64_t D, float* coeff, float* in) {
  const int64_t N = p.N, W = N * D, C = (2 + N) * N;
  std::vector<float> m(size_t(T * C));
  linear(x, fn, nullptr, m.data(), T, W, C);  // x · fnᵀ, then scaled by each row's r
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * W;
    double ss = 0;
    for (int64_t i = 0; i < W; ++i) ss += double(xt[i]) * xt[i];
    const float r = 1.f / std::sqrt(float(ss / double(W)) + p.eps_norm);
    float* mt = m.data() + t * C;
    for (int64_t i = 0; i < C; ++i) mt[i] *= r;
    float* ct = coeff + t * C;
    hc_coeffs(mt, base, scale, p, ct);
    float* it = in + t * D;
    std::fill(it, it + D, 0.f);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t d = 0; d < D; ++d) it[d] += ct[n] * xt[n * D + d];
  }
}

void hc_post(float* x, const float* coeff, const float* y, int64_t N, int64_t T, int64_t D) {
  const int64_t C = (2 + N) * N;
  std::vector<float> old(static_cast<size_t>(N));
  for (int64_t t = 0; t < T; ++t) {
    float* xt = x + t * N * D;
    const float* post = coeff + t * C + N;
    const float* comb = coeff + t * C + 2 * N;
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t n = 0; n < N; ++n) old[size_t(n)] = xt[n * D + d];
      for (int64_t mo = 0; mo < N; ++mo) {
        float s = post[mo] * y[t * D + d];
        for (int64_t n = 0; n < N; ++n) s += comb[n * N + mo] * old[size_t(n)];
        xt[mo * D + d] = s;
      }
    }
  }
}

}  // namespace dz
