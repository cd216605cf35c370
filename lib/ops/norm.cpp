// Normalisations (CPU reference, fp32). Sums of squares go through dz::dot so the reduction
// order is fixed and matches every other reduction in the backend.
#include "ops/norm.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.hpp"
#include "core/linalg.hpp"

namespace dz {

namespace {
// 1 / sqrt(mean(x^2) + eps) for one row.
inline float rms_inv(const float* x, int64_t D, float eps) {
  float ss = dot(x, x, D);
  return 1.f / std::sqrt(ss / float(D) + eps);
}
}  // namespace

void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t D, float eps, bool zero_centered) {
  DZ_CHECK(D > 0 && rows >= 0, "rmsnorm: bad shape [", rows, ", ", D, "]");
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;  // [D]
    float* yr = y + r * D;
    float inv = rms_inv(xr, D, eps);
    // Scale first, then weight: the same rounding order as the Hugging Face modules
    // (weight * (x * rsqrt(var + eps))).
    for (int64_t i = 0; i < D; ++i) {
      float n = xr[i] * inv;
      if (w) n *= zero_centered ? (1.f + w[i]) : w[i];
      yr[i] = n;
    }
  }
}

void gated_rmsnorm(const float* x, const float* gate, const float* w, float* y, int64_t rows, int64_t D, float eps,
                   GateAct act, bool zero_centered) {
  DZ_CHECK(D > 0 && rows >= 0, "gated_rmsnorm: bad shape [", rows, ", ", D, "]");
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;  // [D]
    const float* gr = gate + r * D;
    float* yr = y + r * D;
    float inv = rms_inv(xr, D, eps);
    for (int64_t i = 0; i < D; ++i) {
      float n = xr[i] * inv;
      if (w) n *= zero_centered ? (1.f + w[i]) : w[i];
      float g = act == GateAct::SiLU ? silu(gr[i]) : sigmoid(gr[i]);
      yr[i] = n * g;
    }
  }
}

void l2norm(const float* x, float* y, int64_t rows, int64_t D, float eps) {
  DZ_CHECK(D > 0 && rows >= 0, "l2norm: bad shape [", rows, ", ", D, "]");
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    float inv = 1.f / std::sqrt(dot(xr, xr, D) + eps);
    for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * inv;
  }
}

void attn_res_mix(const float* blocks, int64_t n_blocks, const float* partial, const float* q, int64_t T, int64_t D,
                  float eps, float* out) {
  const int64_t n = n_blocks + 1;
  std::vector<const float*> v(static_cast<size_t>(n));
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < n_blocks; ++i) v[size_t(i)] = blocks + (i * T + t) * D;
    v[size_t(n - 1)] = partial + t * D;
    // score_i = q · (v_i / rms(v_i)); the RMS factor is folded in after the reduction
    float m = -INFINITY;
    for (int64_t i = 0; i < n; ++i) {
      const float ms = dot(v[size_t(i)], v[size_t(i)], D) / float(D);
      const float r = 1.f / std::sqrt(ms + eps);
      w[size_t(i)] = r * dot(v[size_t(i)], q, D);
      m = std::max(m, w[size_t(i)]);
    }
    float z = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      w[size_t(i)] = std::exp(w[size_t(i)] - m);
      z += w[size_t(i)];
    }
    float* o = out + t * D;
    // first term assigned, not added to 0, so a single value passes through bit for bit (-0 included)
    const float a0 = w[0] / z;
    for (int64_t d = 0; d < D; ++d) o[d] = a0 * v[0][d];
    for (int64_t i = 1; i < n; ++i) {
      const float a = w[size_t(i)] / z;
      const float* vi = v[size_t(i)];
      for (int64_t d = 0; d < D; ++d) o[d] += a * vi[d];
    }
  }
}

}  // namespace dz
