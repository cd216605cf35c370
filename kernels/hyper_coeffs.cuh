// Pieces of the mHC kernels (kernels/hyper.cu): the
// coefficients of one token by one warp, and the dispatch on the stream count (formulas and CPU
// reference: lib/ops/hyper.hpp).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "hyper.cuh"

namespace dz::cuda {

constexpr int kMaxN = 8;  // streams (hc_mult) the kernels take

// Calls f(std::integral_constant<int, N>) for 1 <= n <= kMaxN: the streams as a template
// parameter, so that the kernels' register arrays are indexed by constants.
template <class F>
void with_streams(int n, F&& f) {
  static_assert(kMaxN == 8, "with_streams: one case per stream count");
  switch (n) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    case 7: f(std::integral_constant<int, 7>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
  }
}

__device__ __forceinline__ float hc_sigmoidf(float v) { return 1.f / (1.f + expf(-v)); }

// From the token's projection mt [(2+N)N] (unscaled) and its r = rsqrt(mean x² + eps): pre | post |
// comb (after Sinkhorn) into the warp's shared-memory scratch cf [(2+N)N] and to coeff_t. A lane per
// entry of the N x N mixing matrix (two for N > 5); every row and column sum in the CPU
// reference's order, so the values are the serial ones. All 32 lanes call it.
template <int N>
__device__ __forceinline__ void hc_coeffs_warp(const float* mt, float r, const float* base, const float* scale,
                                               const HcKernelParams& p, int lane, float* cf, float* coeff_t) {
  constexpr int C = (2 + N) * N, NN = N * N;
  float* pre = cf;
  float* post = cf + N;
  float* comb = cf + 2 * N;
  if (lane < N) {
    pre[lane] = hc_sigmoidf(mt[lane] * r * scale[0] + base[lane]) + p.eps_hc;
    post[lane] = 2.f * hc_sigmoidf(mt[N + lane] * r * scale[1] + base[N + lane]);
  }
  // this lane's entries i0 = lane and i1 = lane + 32 of comb (row-major a * N + b)
  const int i0 = lane, i1 = lane + 32;
  const bool h0 = i0 < NN, h1 = i1 < NN;
  float v0 = h0 ? mt[2 * N + i0] * r * scale[2] + base[2 * N + i0] : 0.f;
  float v1 = h1 ? mt[2 * N + i1] * r * scale[2] + base[2 * N + i1] : 0.f;
  if (h0) comb[i0] = v0;
  if (h1) comb[i1] = v1;
  __syncwarp();
  // row softmax + eps: the row's max and sum of exps in column order, as the serial loop
  auto row_softmax = [&](int i, float v) {
    const int a = i / N;
    float mx = -INFINITY;
    for (int b = 0; b < N; ++b) mx = fmaxf(mx, comb[a * N + b]);
    float sum = 0.f;
    for (int b = 0; b < N; ++b) sum += expf(comb[a * N + b] - mx);
    return expf(v - mx) / sum + p.eps_hc;
  };
  if (h0) v0 = row_softmax(i0, v0);
  if (h1) v1 = row_softmax(i1, v1);
  __syncwarp();
  if (h0) comb[i0] = v0;
  if (h1) comb[i1] = v1;
  __syncwarp();
  auto row_sum = [&](int i) {
    float sum = 0.f;
    for (int b = 0; b < N; ++b) sum += comb[(i / N) * N + b];
    return sum;
  };
  auto col_sum = [&](int i) {
    float sum = 0.f;
    for (int a = 0; a < N; ++a) sum += comb[a * N + i % N];
    return sum;
  };
  for (int it = 0; it < p.iters; ++it) {
    if (it > 0) {
      const float s0 = h0 ? row_sum(i0) : 1.f, s1 = h1 ? row_sum(i1) : 1.f;
      __syncwarp();
      if (h0) comb[i0] = v0 = v0 / (s0 + p.eps_hc);
      if (h1) comb[i1] = v1 = v1 / (s1 + p.eps_hc);
      __syncwarp();
    }
    const float s0 = h0 ? col_sum(i0) : 1.f, s1 = h1 ? col_sum(i1) : 1.f;
    __syncwarp();
    if (h0) comb[i0] = v0 = v0 / (s0 + p.eps_hc);
    if (h1) comb[i1] = v1 = v1 / (s1 + p.eps_hc);
    __syncwarp();
  }
  for (int i = lane; i < C; i += 32) coeff_t[i] = cf[i];
}

}  // namespace dz::cuda
