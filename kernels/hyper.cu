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
// thread 0 (N <= 8: Sinkhorn on an 8x8 is nothing), then the collapse over d by all threads.
__global__ void k_hc_pre(const float* x, const float* m, const float* base, const float* scale, HcKernelParams p,
                         int64_t D, float* coeff, float* in) {
  const int64_t t = blockIdx.x;
  const int N = p.N, C = (2 + N) * N;
  const float* xt = x + t * N * D;
  __shared__ float red[32];
  __shared__ float cf[(2 + kMaxN) * kMaxN];
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < N * D; i += blockDim.x) ss += xt[i] * xt[i];
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float tot = 0.f;
    for (int w = 0; w < int(blockDim.x + 31) / 32; ++w) tot += red[w];
    const float r = rsqrtf(tot / float(N * D) + p.eps_norm);
    const float* mt = m + t * C;
    float* pre = cf;
    float* post = cf + N;
    float* comb = cf + 2 * N;
    for (int n = 0; n < N; ++n) {
      pre[n] = sigmoidf_(mt[n] * r * scale[0] + base[n]) + p.eps_hc;
      post[n] = 2.f * sigmoidf_(mt[N + n] * r * scale[1] + base[N + n]);
    }
    for (int a = 0; a < N; ++a) {
      float mx = -INFINITY;
      for (int b = 0; b < N; ++b) {
        comb[a * N + b] = mt[2 * N + a * N + b] * r * scale[2] + base[2 * N + a * N + b];
        mx = fmaxf(mx, comb[a * N + b]);
      }
      float s = 0.f;
      for (int b = 0; b < N; ++b) s += (comb[a * N + b] = expf(comb[a * N + b] - mx));
      for (int b = 0; b < N; ++b) comb[a * N + b] = comb[a * N + b] / s + p.eps_hc;
    }
    for (int it = 0; it < p.iters; ++it) {
      if (it > 0)
        for (int a = 0; a < N; ++a) {
          float s = 0.f;
          for (int b = 0; b < N; ++b) s += comb[a * N + b];
          for (int b = 0; b < N; ++b) comb[a * N + b] /= s + p.eps_hc;
        }
      for (int b = 0; b < N; ++b) {
        float s = 0.f;
        for (int a = 0; a < N; ++a) s += comb[a * N + b];
        for (int a = 0; a < N; ++a) comb[a * N + b] /= s + p.eps_hc;
      }
    }
    for (int i = 0; i < C; ++i) coeff[t * C + i] = cf[i];
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
