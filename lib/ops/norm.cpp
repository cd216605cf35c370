// Normalisations (CPU reference, fp32). Sums of squares go through dz::dot so the reduction
// order is fixed and matches every other reduction in the backend.
#include "ops/norm.hpp"

#include <cmath>

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

}  // namespace dz
