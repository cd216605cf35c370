// mHC hyper-connection kernels (hyper.cuh; formulas and CPU reference: lib/ops/hyper.hpp).
#include "hyper.cuh"

#include <cmath>

#include "common.cuh"

namespace dz::cuda {

namespace {

constexpr int kMaxN = 8;

unsigned blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 65535 * 32 ? (b > 0 ? b : 1) : 65535 * 32);
}

__device__ float sigmoidf_(float v) { return 1.f / (1.f + expf(-v)); }

// One block per token: r = rsqrt(mean x² + eps) over N·D (block reduction), the coefficients by
// warp 0 (a lane per entry of the N x N mixing matrix, two for N > 5; every row and column sum in
// the CPU reference's order, so the values are the serial ones), then the collapse over d by all
// threads. (Sinkhorn on thread 0 alone kept the whole block waiting on ~10^3 dependent divisions:
// 13 ms of a GLM-5.3-Flash forward at T = 8192 went to the mHC ops, docs/perf/README.md.)
__global__ void k_hc_pre(const float* x, const float* m, const float* base, const float* scale, HcKernelParams p,
                         int64_t D, float* coeff, float* in) {
  const int64_t t = blockIdx.x;
  const int N = p.N, C = (2 + N) * N, NN = N * N;
  const float* xt = x + t * N * D;
  __shared__ float red[32];
  __shared__ float cf[(2 + kMaxN) * kMaxN];
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < N * D; i += blockDim.x) ss += xt[i] * xt[i];
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float tot = 0.f;
    for (int w = 0; w < int(blockDim.x + 31) / 32; ++w) tot += red[w];
    const float r = rsqrtf(tot / float(N * D) + p.eps_norm);
    const float* mt = m + t * C;
    float* pre = cf;
    float* post = cf + N;
    float* comb = cf + 2 * N;
    if (lane < N) {
      pre[lane] = sigmoidf_(mt[lane] * r * scale[0] + base[lane]) + p.eps_hc;
      post[lane] = 2.f * sigmoidf_(mt[N + lane] * r * scale[1] + base[N + lane]);
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
    for (int i = lane; i < C; i += 32) coeff[t * C + i] = cf[i];
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float s = 0.f;
    for (int n = 0; n < N; ++n) s += cf[n] * xt[n * D + d];
    in[t * D + d] = s;
  }
}

__global__ void k_hc_post(float* x, const float* coeff, const void* y, bool y_bf16, int N, int64_t T, int64_t D) {
  const int C = (2 + N) * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * D; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    const float yv = y_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(y)[i]) : static_cast<const float*>(y)[i];
    const float* post = coeff + t * C + N;
    const float* comb = coeff + t * C + 2 * N;
    float* xt = x + t * N * D + d;
    float old[kMaxN];
    for (int n = 0; n < N; ++n) old[n] = xt[n * D];
    for (int mo = 0; mo < N; ++mo) {
      float s = post[mo] * yv;
      for (int n = 0; n < N; ++n) s += comb[n * N + mo] * old[n];
      xt[mo * D] = s;
    }
  }
}

__global__ void k_hc_expand(const float* h, int N, int64_t T, int64_t D, float* x) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * N * D; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / (N * D), d = i % D;
    x[i] = h[t * D + d];
  }
}

__global__ void k_hc_mean(const float* x, int N, int64_t T, int64_t D, float* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < T * D; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    float s = 0.f;
    for (int n = 0; n < N; ++n) s += x[(t * N + n) * D + d];
    out[i] = s / float(N);
  }
}

}  // namespace

void hc_pre(const float* x, const float* m, const float* base, const float* scale, const HcKernelParams& p, int64_t T,
            int64_t D, float* coeff, float* in, cudaStream_t s) {
  if (T <= 0) return;
  DZ_CHECK(p.N >= 1 && p.N <= kMaxN, "hc_pre: hc_mult ", p.N, " outside 1..", kMaxN);
  k_hc_pre<<<unsigned(T), 256, 0, s>>>(x, m, base, scale, p, D, coeff, in);
  CUDA_CHECK_LAUNCH();
}
void hc_post(float* x, const float* coeff, const void* y, bool y_bf16, int N, int64_t T, int64_t D, cudaStream_t s) {
  if (T * D <= 0) return;
  DZ_CHECK(N >= 1 && N <= kMaxN, "hc_post: hc_mult ", N, " outside 1..", kMaxN);
  k_hc_post<<<blocks_for(T * D, 256), 256, 0, s>>>(x, coeff, y, y_bf16, N, T, D);
  CUDA_CHECK_LAUNCH();
}
void hc_expand(const float* h, int N, int64_t T, int64_t D, float* x, cudaStream_t s) {
  if (T * D <= 0) return;
  k_hc_expand<<<blocks_for(T * N * D, 256), 256, 0, s>>>(h, N, T, D, x);
  CUDA_CHECK_LAUNCH();
}
void hc_mean(const float* x, int N, int64_t T, int64_t D, float* out, cudaStream_t s) {
  if (T * D <= 0) return;
  k_hc_mean<<<blocks_for(T * D, 256), 256, 0, s>>>(x, N, T, D, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda
