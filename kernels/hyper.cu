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
__global__ void __launch_bounds__(kThr) k_hc_pre(const float* x, const float* m, const float* ss_in, const float* base,
                                                 const float* scale, HcKernelParams p, int64_t D, float* coeff,
                                                 float* in) {
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
  if (!ss_in) {  // Σx² here (given: hc_post_proj summed it while writing x)
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
  }
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float tot = 0.f;
    if (ss_in) {
      tot = ss_in[t];
    } else {
      for (int w = 0; w < kThr / 32; ++w) tot += red[w];
    }
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

// hc_post fused with the next sub-layer's projection, for N = 4 streams (GLM-5.3-Flash, DeepSeek-V4)
// and D % 128 == 0: x <- post ⊗ y + combᵀ x as k_hc_post computes it (same order, bitwise), and
// from the new x in the same pass m [T, 24] = x·fnᵀ and ss [T] = Σx² for k_hc_pre. A block takes
// kPT = 16 tokens and walks d in chunks of 128: its threads (token tid / 16, 8 columns) write the
// chunk's new streams to global memory and to a shared tile [16][4·128]; then warp w multiplies the
// tile by outputs 6 (w % 4) .. + 5 of fn for tokens 8 (w / 4) .. + 7, a lane on 4 columns of each
// stream (16-byte shared and global loads), 48 partial sums a lane, reduced over the lanes at the
// end. fn (24 x 4D, 1.5 MiB at D = 4096) is read once per block from L2. (A cuBLAS fp32 GEMM with
// 24 outputs read all of x again at ~24 TFLOP/s: 0.29 ms a call on top of k_hc_post's 0.28 at
// T = 8192, D = 4096.)
constexpr int kPT = 16, kDC = 128;
template <bool YB>
__global__ void __launch_bounds__(kThr, 2) k_hc_post_proj4(float* x, const float* coeff, const void* y, const float* fn,
                                                        int64_t T, int64_t D, float* m, float* ss_out) {
  constexpr int N = 4, C = (2 + N) * N;  // 24
  __shared__ float cf[kPT][C];
  __shared__ __align__(16) float X[kPT][N * kDC];
  const int64_t t0 = int64_t(blockIdx.x) * kPT;
  for (int i = threadIdx.x; i < kPT * C; i += kThr) {
    const int64_t t = t0 + i / C;
    cf[i / C][i % C] = t < T ? coeff[t * C + i % C] : 0.f;
  }
  __syncthreads();
  const int tt = threadIdx.x >> 4, j8 = (threadIdx.x & 15) * 8;  // phase 1: token, first of 8 columns
  const int64_t t = t0 + tt;
  const bool live = t < T;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int c0 = (warp & 3) * 6, q0 = (warp >> 2) * 8;  // phase 2: outputs c0.., tokens q0..
  float acc[8][6];
#pragma unroll
  for (int a = 0; a < 8; ++a)
#pragma unroll
    for (int b = 0; b < 6; ++b) acc[a][b] = 0.f;
  float ss = 0.f;
  for (int64_t d0 = 0; d0 < D; d0 += kDC) {
    // phase 1: the new streams of token tt at columns d0 + j8 .. + 7, to x and the tile
    if (live) {
      float yv[8];
      if constexpr (YB) {
        const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(y) + t * D + d0 + j8);
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
        for (int i = 0; i < 4; ++i) yv[2 * i] = __low2float(h[i]), yv[2 * i + 1] = __high2float(h[i]);
      } else {
        const float* yf = static_cast<const float*>(y) + t * D + d0 + j8;
        const float4 a = *reinterpret_cast<const float4*>(yf), b = *reinterpret_cast<const float4*>(yf + 4);
        yv[0] = a.x, yv[1] = a.y, yv[2] = a.z, yv[3] = a.w, yv[4] = b.x, yv[5] = b.y, yv[6] = b.z, yv[7] = b.w;
      }
      float old[N][8];
      float* xt = x + t * N * D + d0 + j8;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const float4 a = *reinterpret_cast<const float4*>(xt + n * D), b = *reinterpret_cast<const float4*>(xt + n * D + 4);
        old[n][0] = a.x, old[n][1] = a.y, old[n][2] = a.z, old[n][3] = a.w;
        old[n][4] = b.x, old[n][5] = b.y, old[n][6] = b.z, old[n][7] = b.w;
      }
#pragma unroll
      for (int mo = 0; mo < N; ++mo) {
        float nw[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          float s = cf[tt][N + mo] * yv[i];
#pragma unroll
          for (int n = 0; n < N; ++n) s += cf[tt][2 * N + n * N + mo] * old[n][i];
          nw[i] = s;
          ss += s * s;
        }
        const float4 a = make_float4(nw[0], nw[1], nw[2], nw[3]), b = make_float4(nw[4], nw[5], nw[6], nw[7]);
        *reinterpret_cast<float4*>(xt + mo * D) = a;
        *reinterpret_cast<float4*>(xt + mo * D + 4) = b;
        *reinterpret_cast<float4*>(&X[tt][mo * kDC + j8]) = a;
        *reinterpret_cast<float4*>(&X[tt][mo * kDC + j8 + 4]) = b;
      }
    } else {
#pragma unroll
      for (int mo = 0; mo < N; ++mo) {
        *reinterpret_cast<float4*>(&X[tt][mo * kDC + j8]) = make_float4(0.f, 0.f, 0.f, 0.f);
        *reinterpret_cast<float4*>(&X[tt][mo * kDC + j8 + 4]) = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    __syncthreads();
    // phase 2: this warp's 8 tokens x 6 outputs over the chunk, the lane's 4 columns of each stream
#pragma unroll
    for (int n = 0; n < N; ++n) {
      float4 f[6];
#pragma unroll
      for (int b = 0; b < 6; ++b)
        f[b] = __ldg(reinterpret_cast<const float4*>(fn + int64_t(c0 + b) * N * D + n * D + d0 + 4 * lane));
#pragma unroll
      for (int a = 0; a < 8; ++a) {
        const float4 v = *reinterpret_cast<const float4*>(&X[q0 + a][n * kDC + 4 * lane]);
#pragma unroll
        for (int b = 0; b < 6; ++b) acc[a][b] += v.x * f[b].x + v.y * f[b].y + v.z * f[b].z + v.w * f[b].w;
      }
    }
    __syncthreads();
  }
  // Σ over the lanes (xor butterfly: every lane ends with the sums), lane b·8 + a writes one value
#pragma unroll
  for (int a = 0; a < 8; ++a)
#pragma unroll
    for (int b = 0; b < 6; ++b)
#pragma unroll
      for (int o = 16; o; o >>= 1) acc[a][b] += __shfl_xor_sync(0xffffffffu, acc[a][b], o);
#pragma unroll
  for (int a = 0; a < 8; ++a)
#pragma unroll
    for (int b = 0; b < 6; ++b)
      if (lane == ((b * 8 + a) & 31) && t0 + q0 + a < T) m[(t0 + q0 + a) * C + c0 + b] = acc[a][b];
  // Σx² of token tt over its 16 threads (lanes 16·h .. 16·h + 15 of one warp)
#pragma unroll
  for (int o = 8; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 15) == 0 && live) ss_out[t] = ss;
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

void hc_pre(const float* x, const float* m, const float* ss, const float* base, const float* scale,
            const HcKernelParams& p, int64_t T, int64_t D, float* coeff, float* in, cudaStream_t s) {
  if (T <= 0) return;
  DZ_CHECK(p.N >= 1 && p.N <= kMaxN, "hc_pre: hc_mult ", p.N, " outside 1..", kMaxN);
  DZ_CHECK(T < (int64_t(1) << 31), "hc_pre: ", T, " tokens (< 2^31)");
  const bool v4 = vec4(D, {x, in});
  with_streams(p.N, [&](auto n) {
    constexpr int N = decltype(n)::value;
    if (v4)
      k_hc_pre<N, 4><<<unsigned(T), kThr, 0, s>>>(x, m, ss, base, scale, p, D, coeff, in);
    else
      k_hc_pre<N, 1><<<unsigned(T), kThr, 0, s>>>(x, m, ss, base, scale, p, D, coeff, in);
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
bool hc_post_proj_fits(int N, int64_t D, const float* x, const void* y, bool y_bf16, const float* fn) {
  return N == 4 && D % kDC == 0 && aligned16(x) && aligned16(y) && aligned16(fn) && (y_bf16 || D % 4 == 0);
}
void hc_post_proj(float* x, const float* coeff, const void* y, bool y_bf16, int N, int64_t T, int64_t D,
                  const float* fn, float* m, float* ss, cudaStream_t s) {
  if (T <= 0) return;
  DZ_CHECK(hc_post_proj_fits(N, D, x, y, y_bf16, fn), "hc_post_proj: N = ", N, ", D = ", D,
           " or the operands' alignment outside what the fused kernel takes (hc_post_proj_fits)");
  DZ_CHECK(D > 0 && (T + kPT - 1) / kPT < (int64_t(1) << 31), "hc_post_proj: ", T, " tokens");
  const unsigned blocks = unsigned((T + kPT - 1) / kPT);
  if (y_bf16)
    k_hc_post_proj4<true><<<blocks, kThr, 0, s>>>(x, coeff, y, fn, T, D, m, ss);
  else
    k_hc_post_proj4<false><<<blocks, kThr, 0, s>>>(x, coeff, y, fn, T, D, m, ss);
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
