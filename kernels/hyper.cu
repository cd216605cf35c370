// mHC hyper-connection kernels (hyper.cuh; formulas and CPU reference: lib/ops/hyper.hpp).
#include "hyper.cuh"

#include <cmath>
#include <initializer_list>

#include "common.cuh"
#include "hyper_coeffs.cuh"

namespace dz::cuda {

namespace {

// A token row of one stream in chunks of W floats (W = 4: 16-byte vectors, D % 4 == 0 and the
// pointers 16-byte aligned; W = 1 otherwise). Chunk c of this thread is c = threadIdx.x + kThr * j.
constexpr int kThr = 256;
constexpr int kCache = 4;  // chunks per thread and stream held in registers by k_hc_pre
template <int W>
struct Vec;
template <>
struct Vec<4> {
  using T = float4;
  __device__ static T ld(const float* p) { return *reinterpret_cast<const float4*>(p); }
  __device__ static void st(float* p, T v) { *reinterpret_cast<float4*>(p) = v; }
  __device__ static float get(const T& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
  __device__ static void set(T& v, int i, float f) { (i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w) = f; }
};
template <>
struct Vec<1> {
  using T = float;
  __device__ static T ld(const float* p) { return *p; }
  __device__ static void st(float* p, T v) { *p = v; }
  __device__ static float get(const T& v, int) { return v; }
  __device__ static void set(T& v, int, float f) { v = f; }
};

// One block per token: r = rsqrt(mean x² + eps) over N·D (block reduction), the coefficients by
// warp 0 (a lane per entry of the N x N mixing matrix, two for N > 5; every row and column sum in
// the CPU reference's order, so the values are the serial ones), then the collapse over d by all
// threads. The token's first kThr·kCache·W columns of every stream are loaded once, all loads in
// flight together, and kept in registers for the collapse (columns past that are read again).
// (At one scalar load in flight per thread, 8 launches took 7.9 ms of a GLM-5.3-Flash forward at
// T = 8192: docs/perf/README.md.)
template <int N, int W>
__global__ void __launch_bounds__(kThr) k_hc_pre(const float* x, const float* m, const float* base, const float* scale,
                                                 HcKernelParams p, int64_t D, float* coeff, float* in) {
  using V = Vec<W>;
  const int64_t t = blockIdx.x;
  constexpr int C = (2 + N) * N;
  const float* xt = x + t * N * D;
  const int64_t nch = D / W;  // chunks per stream
  __shared__ float red[32];
  __shared__ float cf[(2 + kMaxN) * kMaxN];
  typename V::T xr[N][kCache];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int64_t c = threadIdx.x + int64_t(kThr) * j;
    if (c < nch) {
#pragma unroll
      for (int n = 0; n < N; ++n) xr[n][j] = V::ld(xt + n * D + c * W);
    }
  }
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int64_t c = threadIdx.x + int64_t(kThr) * j;
    if (c < nch) {
#pragma unroll
      for (int n = 0; n < N; ++n)
#pragma unroll
        for (int i = 0; i < W; ++i) ss += V::get(xr[n][j], i) * V::get(xr[n][j], i);
    }
  }
  for (int64_t c = threadIdx.x + int64_t(kThr) * kCache; c < nch; c += kThr) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const typename V::T v = V::ld(xt + n * D + c * W);
#pragma unroll
      for (int i = 0; i < W; ++i) ss += V::get(v, i) * V::get(v, i);
    }
  }
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float tot = 0.f;
    for (int w = 0; w < kThr / 32; ++w) tot += red[w];
    const float r = rsqrtf(tot / float(N * D) + p.eps_norm);
    const float* mt = m + t * C;
    hc_coeffs_warp<N>(mt, r, base, scale, p, lane, cf, coeff + t * C);
  }
  __syncthreads();
  float pre[N];
#pragma unroll
  for (int n = 0; n < N; ++n) pre[n] = cf[n];
  auto collapse = [&](int64_t c, const typename V::T* xs) {
    typename V::T o;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      float s = 0.f;
#pragma unroll
      for (int n = 0; n < N; ++n) s += pre[n] * V::get(xs[n], i);
      V::set(o, i, s);
    }
    V::st(in + t * D + c * W, o);
  };
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int64_t c = threadIdx.x + int64_t(kThr) * j;
    if (c < nch) {
      typename V::T xs[N];
#pragma unroll
      for (int n = 0; n < N; ++n) xs[n] = xr[n][j];
      collapse(c, xs);
    }
  }
  for (int64_t c = threadIdx.x + int64_t(kThr) * kCache; c < nch; c += kThr) {
    typename V::T xs[N];
#pragma unroll
    for (int n = 0; n < N; ++n) xs[n] = V::ld(xt + n * D + c * W);
    collapse(c, xs);
  }
}

// One block per token: x[t, mo, :] = post[mo] y[t, :] + Σ_n comb[n, mo] x_old[t, n, :], every
// stream's chunk read before any is written (the streams are updated in place).
template <int N, int W>
__global__ void __launch_bounds__(kThr) k_hc_post(float* x, const float* coeff, const void* y, bool y_bf16, int64_t D) {
  using V = Vec<W>;
  const int64_t t = blockIdx.x, nch = D / W;
  constexpr int C = (2 + N) * N;
  float post[N], comb[N * N];
#pragma unroll
  for (int i = 0; i < N; ++i) post[i] = coeff[t * C + N + i];
#pragma unroll
  for (int i = 0; i < N * N; ++i) comb[i] = coeff[t * C + 2 * N + i];
  float* xt = x + t * N * D;
  for (int64_t c = threadIdx.x; c < nch; c += kThr) {
    float yv[W];
    if (y_bf16) {
      const __nv_bfloat16* yb = static_cast<const __nv_bfloat16*>(y) + t * D + c * W;
      if constexpr (W == 4) {
        const uint2 u = *reinterpret_cast<const uint2*>(yb);
        const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&u.x), b = *reinterpret_cast<const __nv_bfloat162*>(&u.y);
        yv[0] = __low2float(a), yv[1] = __high2float(a), yv[2] = __low2float(b), yv[3] = __high2float(b);
      } else {
        yv[0] = __bfloat162float(yb[0]);
      }
    } else {
      const typename V::T v = V::ld(static_cast<const float*>(y) + t * D + c * W);
#pragma unroll
      for (int i = 0; i < W; ++i) yv[i] = V::get(v, i);
    }
    typename V::T old[N];
#pragma unroll
    for (int n = 0; n < N; ++n) old[n] = V::ld(xt + n * D + c * W);
#pragma unroll
    for (int mo = 0; mo < N; ++mo) {
      typename V::T o;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        float s = post[mo] * yv[i];
#pragma unroll
        for (int n = 0; n < N; ++n) s += comb[n * N + mo] * V::get(old[n], i);
        V::set(o, i, s);
      }
      V::st(xt + mo * D + c * W, o);
    }
  }
}

// One block per token: x[t, n, :] = h[t, :] for every stream n.
template <int W>
__global__ void __launch_bounds__(kThr) k_hc_expand(const float* h, int N, int64_t D, float* x) {
  using V = Vec<W>;
  const int64_t t = blockIdx.x, nch = D / W;
  for (int64_t c = threadIdx.x; c < nch; c += kThr) {
    const typename V::T v = V::ld(h + t * D + c * W);
    for (int n = 0; n < N; ++n) V::st(x + (t * N + n) * D + c * W, v);
  }
}

// One block per token: out[t, :] = (Σ_n x[t, n, :]) / N, n ascending.
template <int W>
__global__ void __launch_bounds__(kThr) k_hc_mean(const float* x, int N, int64_t D, float* out) {
  using V = Vec<W>;
  const int64_t t = blockIdx.x, nch = D / W;
  for (int64_t c = threadIdx.x; c < nch; c += kThr) {
    float s[W];
#pragma unroll
    for (int i = 0; i < W; ++i) s[i] = 0.f;
    for (int n = 0; n < N; ++n) {
      const typename V::T v = V::ld(x + (t * N + n) * D + c * W);
#pragma unroll
      for (int i = 0; i < W; ++i) s[i] += V::get(v, i);
    }
    typename V::T o;
#pragma unroll
    for (int i = 0; i < W; ++i) V::set(o, i, s[i] / float(N));
    V::st(out + t * D + c * W, o);
  }
}

// 16-byte chunks when every row start of every operand is 16-byte aligned.
bool vec4(int64_t D, std::initializer_list<const void*> ps) {
  if (D % 4) return false;
  for (const void* q : ps)
    if (q && !aligned16(q)) return false;
  return true;
}

}  // namespace

void hc_pre(const float* x, const float* m, const float* base, const float* scale, const HcKernelParams& p, int64_t T,
            int64_t D, float* coeff, float* in, cudaStream_t s) {
  if (T <= 0) return;
  DZ_CHECK(p.N >= 1 && p.N <= kMaxN, "hc_pre: hc_mult ", p.N, " outside 1..", kMaxN);
  DZ_CHECK(T < (int64_t(1) << 31), "hc_pre: ", T, " tokens (< 2^31)");
  const bool v4 = vec4(D, {x, in});
  with_streams(p.N, [&](auto n) {
    constexpr int N = decltype(n)::value;
    if (v4)
      k_hc_pre<N, 4><<<unsigned(T), kThr, 0, s>>>(x, m, base, scale, p, D, coeff, in);
    else
      k_hc_pre<N, 1><<<unsigned(T), kThr, 0, s>>>(x, m, base, scale, p, D, coeff, in);
  });
  CUDA_CHECK_LAUNCH();
}
void hc_post(float* x, const float* coeff, const void* y, bool y_bf16, int N, int64_t T, int64_t D, cudaStream_t s) {
  if (T * D <= 0) return;
  DZ_CHECK(N >= 1 && N <= kMaxN, "hc_post: hc_mult ", N, " outside 1..", kMaxN);
  DZ_CHECK(T < (int64_t(1) << 31), "hc_post: ", T, " tokens (< 2^31)");
  // bf16 y: 8-byte loads of 4 values
  const bool v4 = vec4(D, {x}) && (y_bf16 ? (reinterpret_cast<uintptr_t>(y) & 7) == 0 : aligned16(y));
  with_streams(N, [&](auto n) {
    constexpr int NS = decltype(n)::value;
    if (v4)
      k_hc_post<NS, 4><<<unsigned(T), kThr, 0, s>>>(x, coeff, y, y_bf16, D);
    else
      k_hc_post<NS, 1><<<unsigned(T), kThr, 0, s>>>(x, coeff, y, y_bf16, D);
  });
  CUDA_CHECK_LAUNCH();
}
void hc_expand(const float* h, int N, int64_t T, int64_t D, float* x, cudaStream_t s) {
  if (T * D <= 0) return;
  DZ_CHECK(T < (int64_t(1) << 31), "hc_expand: ", T, " tokens (< 2^31)");
  if (vec4(D, {h, x}))
    k_hc_expand<4><<<unsigned(T), kThr, 0, s>>>(h, N, D, x);
  else
    k_hc_expand<1><<<unsigned(T), kThr, 0, s>>>(h, N, D, x);
  CUDA_CHECK_LAUNCH();
}
void hc_mean(const float* x, int N, int64_t T, int64_t D, float* out, cudaStream_t s) {
  if (T * D <= 0) return;
  DZ_CHECK(T < (int64_t(1) << 31), "hc_mean: ", T, " tokens (< 2^31)");
  if (vec4(D, {x, out}))
    k_hc_mean<4><<<unsigned(T), kThr, 0, s>>>(x, N, D, out);
  else
    k_hc_mean<1><<<unsigned(T), kThr, 0, s>>>(x, N, D, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda
