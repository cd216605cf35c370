#include "ops/short_conv.hpp"

#include <vector>

#include "core/error.hpp"
#include "core/linalg.hpp"

namespace dz {

void short_conv_silu(const float* x, const float* w, const float* bias, int64_t T, int64_t C, int64_t W, float* state,
                     float* y) {
  DZ_CHECK(W >= 1 && C >= 0 && T >= 0, "short_conv_silu: bad sizes T=", T, " C=", C, " W=", W);
  const int64_t P = W - 1;  // rows of history
  // Input row s in [-P, T): from the state for s < 0, else from x.
  auto in_row = [&](int64_t s) -> const float* { return s < 0 ? state + (P + s) * C : x + s * C; };
  for (int64_t t = 0; t < T; ++t) {
    float* yr = y + t * C;
    for (int64_t c = 0; c < C; ++c) yr[c] = bias ? bias[c] : 0.f;
    // j ascending for every output element: the same order whatever the chunking.
    for (int64_t j = 0; j < W; ++j) {
      const float* xr = in_row(t - P + j);
      for (int64_t c = 0; c < C; ++c) yr[c] += w[c * W + j] * xr[c];
    }
    for (int64_t c = 0; c < C; ++c) yr[c] = silu(yr[c]);
  }
  if (P == 0) return;
  // New state: the last P rows of [state; x].
  std::vector<float> tail(size_t(P * C));
  for (int64_t r = 0; r < P; ++r) {
    const float* src = in_row(T - P + r);
    for (int64_t c = 0; c < C; ++c) tail[size_t(r * C + c)] = src[c];
  }
  for (int64_t i = 0; i < P * C; ++i) state[i] = tail[size_t(i)];
}

}  // namespace dz
