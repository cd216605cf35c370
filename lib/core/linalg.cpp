#include "core/linalg.hpp"

#include <cmath>
#include <cstring>

namespace dz {

float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// 4 rows of W against 1 row of x per step: the x row stays in L1 and W streams once per 4 outputs.
static void row_times_wt(const float* xr, const float* W, float* yr, int64_t in, int64_t out) {
  int64_t o = 0;
  for (; o + 4 <= out; o += 4) {
    const float* w0 = W + (o + 0) * in;
    const float* w1 = W + (o + 1) * in;
    const float* w2 = W + (o + 2) * in;
    const float* w3 = W + (o + 3) * in;
    float a0[8] = {0}, a1[8] = {0}, a2[8] = {0}, a3[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= in; i += 8)
      for (int j = 0; j < 8; ++j) {
        float xv = xr[i + j];
        a0[j] += xv * w0[i + j];
        a1[j] += xv * w1[i + j];
        a2[j] += xv * w2[i + j];
        a3[j] += xv * w3[i + j];
      }
    for (int j = 0; i < in; ++i, ++j) {
      float xv = xr[i];
      a0[j] += xv * w0[i];
      a1[j] += xv * w1[i];
      a2[j] += xv * w2[i];
      a3[j] += xv * w3[i];
    }
    auto red = [](const float* a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); };
    yr[o + 0] = red(a0);
    yr[o + 1] = red(a1);
    yr[o + 2] = red(a2);
    yr[o + 3] = red(a3);
  }
  for (; o < out; ++o) yr[o] = dot(xr, W + o * in, in);
}

void linear(const float* x, const float* W, const float* bias, float* y, int64_t T, int64_t in, int64_t out) {
  for (int64_t t = 0; t < T; ++t) {
    float* yr = y + t * out;
    row_times_wt(x + t * in, W, yr, in, out);
    if (bias)
      for (int64_t o = 0; o < out; ++o) yr[o] += bias[o];
  }
}

void linear_acc(const float* x, const float* W, float* y, int64_t T, int64_t in, int64_t out) {
  float tmp[256];
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t o0 = 0; o0 < out; o0 += 256) {
      int64_t n = out - o0 < 256 ? out - o0 : 256;
      row_times_wt(x + t * in, W + o0 * in, tmp, in, n);
      for (int64_t o = 0; o < n; ++o) y[t * out + o0 + o] += tmp[o];
    }
  }
}

float softplus(float x) {
  // torch.nn.functional.softplus with beta=1, threshold=20
  return x > 20.f ? x : std::log1p(std::exp(x));
}

}  // namespace dz
