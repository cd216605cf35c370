// mHC hyper-connection kernels (hyper.cuh; formulas and CPU reference: lib/ops/hyper.hpp).
#include "hyper.cuh"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "common.cuh"
#include "hyper_coeffs.cuh"
#include "mma_sm80.cuh"

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
// BC: every stream is x [T, D] itself (the first sub-layer, the streams not yet written): the same
// arithmetic on the same values, one register copy of the row (a quarter of the registers at N = 4:
// the kernel is latency-bound, occupancy is its speed; with four copies it took 0.35 ms for
// GLM-5.3-Flash's T = 8192 at two blocks per SM).
template <int N, int W, bool BC>
__global__ void __launch_bounds__(kThr) k_hc_pre(const float* x, const float* m, const float* base, const float* scale,
                                                 HcKernelParams p, int64_t D, float* coeff, float* in) {
  using V = Vec<W>;
  const int64_t t = blockIdx.x;
  constexpr int C = (2 + N) * N, NR = BC ? 1 : N;  // NR: row copies held in registers
  const float* xt = x + t * (BC ? 1 : N) * D;
  const int64_t sd = BC ? 0 : D;  // stream stride
  const int64_t nch = D / W;  // chunks per stream
  __shared__ float red[32];
  __shared__ float cf[(2 + kMaxN) * kMaxN];
  typename V::T xr[NR][kCache];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int64_t c = threadIdx.x + int64_t(kThr) * j;
    if (c < nch) {
#pragma unroll
      for (int n = 0; n < NR; ++n) xr[n][j] = V::ld(xt + n * sd + c * W);
    }
  }
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int64_t c = threadIdx.x + int64_t(kThr) * j;
    if (c < nch) {
#pragma unroll
      for (int n = 0; n < N; ++n)
#pragma unroll
        for (int i = 0; i < W; ++i) ss += V::get(xr[BC ? 0 : n][j], i) * V::get(xr[BC ? 0 : n][j], i);
    }
  }
  for (int64_t c = threadIdx.x + int64_t(kThr) * kCache; c < nch; c += kThr) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const typename V::T v = V::ld(xt + n * sd + c * W);
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
      for (int n = 0; n < N; ++n) xs[n] = xr[BC ? 0 : n][j];
      collapse(c, xs);
    }
  }
  for (int64_t c = threadIdx.x + int64_t(kThr) * kCache; c < nch; c += kThr) {
    typename V::T xs[N];
#pragma unroll
    for (int n = 0; n < N; ++n) xs[n] = V::ld(xt + n * sd + c * W);
    collapse(c, xs);
  }
}

// One block per token: x[t, mo, :] = post[mo] y[t, :] + Σ_n comb[n, mo] x_old[t, n, :], every
// stream's chunk read before any is written (the streams are updated in place). mean: the new
// streams are not written; mean[t, :] = their mean instead, summed and divided as k_hc_mean does
// (bitwise hc_post + hc_mean, without writing the streams and reading them back).
template <int N, int W>
__global__ void __launch_bounds__(kThr) k_hc_post(float* x, const float* coeff, const void* y, bool y_bf16, int64_t D,
                                                  float* mean) {
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
    float acc[W];
#pragma unroll
    for (int i = 0; i < W; ++i) acc[i] = 0.f;
#pragma unroll
    for (int mo = 0; mo < N; ++mo) {
      typename V::T o;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        float s = post[mo] * yv[i];
#pragma unroll
        for (int n = 0; n < N; ++n) s += comb[n * N + mo] * V::get(old[n], i);
        V::set(o, i, s);
        acc[i] += s;
      }
      if (!mean) V::st(xt + mo * D + c * W, o);
    }
    if (mean) {
      typename V::T o;
#pragma unroll
      for (int i = 0; i < W; ++i) V::set(o, i, acc[i] / float(N));
      V::st(mean + t * D + c * W, o);
    }
  }
}

// hc_post fused with the next sub-layer's projection and coefficients, for N = 4 streams
// (GLM-5.3-Flash, DeepSeek-V4) and D % 128 == 0: x <- post ⊗ y + combᵀ x as k_hc_post computes it
// (same order, bitwise), and from the new x in the same pass m = x·fnᵀ [24] and Σx² per token, then
// the next coefficients as k_hc_pre computes them from m. A block takes kPT = 16 tokens and walks
// d in chunks of 128: its threads (token tid / 16, 8 columns) write the chunk's new streams to
// global memory and to a shared tile [16][4·128 + 16]; then the projection of the tile on tensor
// cores as 3xTF32 (mma.sync m16n8k8: a = hi + lo, b = hi + lo, the products lo·hi + hi·lo + hi·hi,
// each part rounded to tf32: ~fp32's accuracy, not bitwise k_hc_pre's sums): warp w takes stream
// w / 2, chunk columns (w % 2)·64 .. + 63 as 4 k-pairs of 16 columns; lane (g = lane / 4, t = lane %
// 4) reads columns 4t .. 4t + 3 of a pair as a float4 of tokens g and g + 8 (A) and of outputs 8j +
// g, j < 3 (B, from fn in global memory: 24 x 4D, 1.5 MiB at D = 4096, read once per block from L2);
// mma step s of the pair takes columns 4t + 2s, 4t + 2s + 1 as its k = t, t + 4 (the same
// permutation for A and B). Partial m per warp [16 x 24], summed over the 8 warps in shared memory
// at the end (warp order fixed). Last, m and Σx² of the 16 tokens go to the
// (free) tile and warp w computes tokens 2w, 2w + 1's coefficients (hc_coeffs_warp) into coeff_next,
// which may be coeff: a block reads its tokens' coeff before it writes theirs. (History, GLM-5.3-Flash
// at T = 8192, H200: a cuBLAS fp32 GEMM with 24 outputs read all of x again at ~24 TFLOP/s, 0.29 ms
// a call on top of k_hc_post's 0.28; fused, 0.48 ms with k_hc_pre's block per token after it at
// 0.29, whose warps wait on warp 0's Sinkhorn iterations; coefficients here: 0.49 ms, and the
// collapse with the norm 0.15 ms instead of 0.29 + 0.08: docs/perf/experiments_2026-12-03d.txt.
// The projection as SIMT FMAs issued ~824 instructions a warp per chunk, and double-buffering
// phase 1's loads gained nothing; on tensor cores ~330: 0.479 -> 0.381 ms a call, 2.38 -> 2.99 TB/s,
// kernels/dev/hyper/run.sh, docs/perf/README.md, 2026-12-05. Loading fn before phase 1 gained
// nothing (0.382), 3 blocks an SM lost (0.457).)
constexpr int kPT = 16, kDC = 128, kXS = 4 * kDC + 16;  // row stride ≡ 16 (mod 32): float4 reads of rows g, g+1 conflict-free
__device__ __forceinline__ float f4get(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
template <bool YB>
__global__ void __launch_bounds__(kThr, 2) k_hc_post_coeff4(float* x, const float* bc, const float* coeff, const void* y,
                                                         const float* fn, int64_t T, int64_t D, const float* base,
                                                         const float* scale, HcKernelParams p, float* coeff_next) {
  constexpr int N = 4, C = (2 + N) * N;  // 24
  __shared__ float cf[kPT][C];
  __shared__ __align__(16) float X[kPT][kXS];
  const int64_t t0 = int64_t(blockIdx.x) * kPT;
  for (int i = threadIdx.x; i < kPT * C; i += kThr) {
    const int64_t t = t0 + i / C;
    cf[i / C][i % C] = t < T ? coeff[t * C + i % C] : 0.f;
  }
  __syncthreads();
  const int tt = threadIdx.x >> 4, j8 = (threadIdx.x & 15) * 8;  // phase 1: token, first of 8 columns
  const int64_t t = t0 + tt;
  const bool live = t < T;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int ns = warp >> 1, kc0 = (warp & 1) * 64;  // phase 2: stream, first chunk column
  float acc[3][4];
#pragma unroll
  for (int j = 0; j < 3; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
  float ss = 0.f;
  const float* fw = fn + int64_t(g) * N * D + ns * D + kc0 + 4 * tq;  // output g, this lane's columns
  const int64_t fj = int64_t(8) * N * D;                              // next 8 outputs
  for (int64_t d0 = 0; d0 < D; d0 += kDC) {
    float4 f[4][3];
    auto load_f = [&]() {
#pragma unroll
      for (int q = 0; q < 4; ++q)
#pragma unroll
        for (int j = 0; j < 3; ++j) f[q][j] = __ldg(reinterpret_cast<const float4*>(fw + j * fj + d0 + 16 * q));
    };
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
      const float* src = bc ? bc + t * D + d0 + j8 : xt;  // bc: every old stream is bc's row
      const int64_t sd = bc ? 0 : D;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const float4 a = *reinterpret_cast<const float4*>(src + n * sd), b = *reinterpret_cast<const float4*>(src + n * sd + 4);
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
    load_f();
    // phase 2: this warp's 64 columns of stream ns, 4 k-pairs x 2 mma steps x 3 output tiles x 3 parts
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = ns * kDC + kc0 + 16 * q + 4 * tq;
      const float4 xa = *reinterpret_cast<const float4*>(&X[g][col]), xb = *reinterpret_cast<const float4*>(&X[g + 8][col]);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        uint32_t ahi[4], alo[4];
        split_tf32(f4get(xa, 2 * s), ahi[0], alo[0]);      // (g, k = t)
        split_tf32(f4get(xb, 2 * s), ahi[1], alo[1]);      // (g + 8, t)
        split_tf32(f4get(xa, 2 * s + 1), ahi[2], alo[2]);  // (g, t + 4)
        split_tf32(f4get(xb, 2 * s + 1), ahi[3], alo[3]);  // (g + 8, t + 4)
#pragma unroll
        for (int j = 0; j < 3; ++j) {
          uint32_t bh0, bl0, bh1, bl1;
          split_tf32(f4get(f[q][j], 2 * s), bh0, bl0);
          split_tf32(f4get(f[q][j], 2 * s + 1), bh1, bl1);
          mma_tf32(acc[j], alo, bh0, bh1);
          mma_tf32(acc[j], ahi, bl0, bl1);
          mma_tf32(acc[j], ahi, bh0, bh1);
        }
      }
    }
    __syncthreads();
  }
  // Σx² of token tt over its 16 threads (lanes 16·h .. 16·h + 15 of one warp)
#pragma unroll
  for (int o = 8; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  float* part = &X[0][0];             // [8 warps][kPT][C]: each warp's partial m
  float* mm = part + 8 * kPT * C;     // [kPT][C]: m of the block's tokens
  float* sq = mm + kPT * C;           // [kPT]: their Σx²
  float* scr = sq + kPT + warp * C;   // this warp's scratch [C]
  static_assert(8 * kPT * C + kPT * C + kPT + 8 * C <= kPT * kXS, "the end's scratch fits in the tile");
  float* pw = part + warp * kPT * C;
#pragma unroll
  for (int j = 0; j < 3; ++j) {
    pw[g * C + 8 * j + 2 * tq] = acc[j][0];
    pw[g * C + 8 * j + 2 * tq + 1] = acc[j][1];
    pw[(g + 8) * C + 8 * j + 2 * tq] = acc[j][2];
    pw[(g + 8) * C + 8 * j + 2 * tq + 1] = acc[j][3];
  }
  if ((threadIdx.x & 15) == 0) sq[tt] = ss;
  __syncthreads();
  for (int i = threadIdx.x; i < kPT * C; i += kThr) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) s += part[w * kPT * C + i];
    mm[i] = s;
  }
  __syncthreads();
#pragma unroll 1
  for (int k = 0; k < 2; ++k) {
    const int q = 2 * warp + k;
    if (t0 + q >= T) break;
    const float r = rsqrtf(sq[q] / float(N * D) + p.eps_norm);
    hc_coeffs_warp<N>(mm + q * C, r, base, scale, p, lane, scr, coeff_next + (t0 + q) * C);
    __syncwarp();
  }
}

// The collapse of hc_post_coeff's streams fused with the sub-layer's RMSNorm, N = 4: one block per
// token, in = Σ_n pre[n] x[n] (n ascending, as k_hc_pre) kept in registers for the token's first
// kThr·kCache 16-byte chunks (later ones collapsed again for the output), Σ in² by a block
// reduction, out = in · (1 / sqrt(mean in² + eps)) · w (1 + w zero-centred), as k_rmsnorm8. The fp32
// input row is never written.
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void st4(__nv_bfloat16* p, float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&a);
  u.y = *reinterpret_cast<const uint32_t*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}
template <typename TY>
__global__ void __launch_bounds__(kThr) k_hc_collapse_norm4(const float* x, const float* coeff, const float* w,
                                                            float eps, bool zc, int64_t D, TY* out) {
  constexpr int N = 4, C = (2 + N) * N;
  const int64_t t = blockIdx.x, nch = D / 4;
  const float4 p4 = *reinterpret_cast<const float4*>(coeff + t * C);
  const float pre[N] = {p4.x, p4.y, p4.z, p4.w};
  const float* xt = x + t * N * D;
  auto collapse = [&](const float4 (&v)[N]) {
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      o.x += pre[n] * v[n].x;
      o.y += pre[n] * v[n].y;
      o.z += pre[n] * v[n].z;
      o.w += pre[n] * v[n].w;
    }
    return o;
  };
  auto load = [&](int64_t c, float4 (&v)[N]) {
#pragma unroll
    for (int n = 0; n < N; ++n) v[n] = *reinterpret_cast<const float4*>(xt + n * D + 4 * c);
  };
  float4 xr[kCache][N];
#pragma unroll
  for (int j = 0; j < kCache; ++j)
    if (threadIdx.x + int64_t(kThr) * j < nch) load(threadIdx.x + int64_t(kThr) * j, xr[j]);
  float4 o[kCache];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    if (threadIdx.x + int64_t(kThr) * j < nch) {
      o[j] = collapse(xr[j]);
      ss += o[j].x * o[j].x + o[j].y * o[j].y + o[j].z * o[j].z + o[j].w * o[j].w;
    }
  }
  for (int64_t c = threadIdx.x + int64_t(kThr) * kCache; c < nch; c += kThr) {
    float4 v[N];
    load(c, v);
    const float4 q = collapse(v);
    ss += q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
  }
  __shared__ float red[kThr / 32];
  for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < kThr / 32; ++i) tot += red[i];
  const float inv = 1.f / sqrtf(tot / float(D) + eps);
  auto emit = [&](int64_t c, float4 v) {
    float4 wv = make_float4(1.f, 1.f, 1.f, 1.f);
    if (w) {
      wv = *reinterpret_cast<const float4*>(w + 4 * c);
      if (zc) wv.x += 1.f, wv.y += 1.f, wv.z += 1.f, wv.w += 1.f;
    }
    st4(out + t * D + 4 * c, make_float4(v.x * inv * wv.x, v.y * inv * wv.y, v.z * inv * wv.z, v.w * inv * wv.w));
  };
#pragma unroll
  for (int j = 0; j < kCache; ++j)
    if (threadIdx.x + int64_t(kThr) * j < nch) emit(threadIdx.x + int64_t(kThr) * j, o[j]);
  for (int64_t c = threadIdx.x + int64_t(kThr) * kCache; c < nch; c += kThr) {
    float4 v[N];
    load(c, v);
    emit(c, collapse(v));
  }
}

// fs [C, D] = Σ_n fn[c, n·D + d], n ascending: the projection of N equal streams h is h · fsᵀ.
__global__ void k_hc_fn_sum(const float* fn, int64_t C, int N, int64_t D, float* fs) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < C * D; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i / D, d = i % D;
    float s = 0.f;
    for (int n = 0; n < N; ++n) s += fn[(c * N + n) * D + d];
    fs[i] = s;
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
            int64_t D, float* coeff, float* in, cudaStream_t s, bool bc) {
  if (T <= 0) return;
  DZ_CHECK(p.N >= 1 && p.N <= kMaxN, "hc_pre: hc_mult ", p.N, " outside 1..", kMaxN);
  DZ_CHECK(T < (int64_t(1) << 31), "hc_pre: ", T, " tokens (< 2^31)");
  const bool v4 = vec4(D, {x, in});
  with_streams(p.N, [&](auto n) {
    constexpr int N = decltype(n)::value;
    if (v4 && bc)
      k_hc_pre<N, 4, true><<<unsigned(T), kThr, 0, s>>>(x, m, base, scale, p, D, coeff, in);
    else if (v4)
      k_hc_pre<N, 4, false><<<unsigned(T), kThr, 0, s>>>(x, m, base, scale, p, D, coeff, in);
    else if (bc)
      k_hc_pre<N, 1, true><<<unsigned(T), kThr, 0, s>>>(x, m, base, scale, p, D, coeff, in);
    else
      k_hc_pre<N, 1, false><<<unsigned(T), kThr, 0, s>>>(x, m, base, scale, p, D, coeff, in);
  });
  CUDA_CHECK_LAUNCH();
}
void hc_post(float* x, const float* coeff, const void* y, bool y_bf16, int N, int64_t T, int64_t D, cudaStream_t s,
             float* mean) {
  if (T * D <= 0) return;
  DZ_CHECK(N >= 1 && N <= kMaxN, "hc_post: hc_mult ", N, " outside 1..", kMaxN);
  DZ_CHECK(T < (int64_t(1) << 31), "hc_post: ", T, " tokens (< 2^31)");
  // bf16 y: 8-byte loads of 4 values
  const bool v4 = vec4(D, {x, mean}) && (y_bf16 ? (reinterpret_cast<uintptr_t>(y) & 7) == 0 : aligned16(y));
  with_streams(N, [&](auto n) {
    constexpr int NS = decltype(n)::value;
    if (v4)
      k_hc_post<NS, 4><<<unsigned(T), kThr, 0, s>>>(x, coeff, y, y_bf16, D, mean);
    else
      k_hc_post<NS, 1><<<unsigned(T), kThr, 0, s>>>(x, coeff, y, y_bf16, D, mean);
  });
  CUDA_CHECK_LAUNCH();
}
bool hc_post_coeff_fits(int N, int64_t D, const float* x, const void* y, bool y_bf16, const float* fn, const float* bc) {
  return N == 4 && D % kDC == 0 && aligned16(x) && aligned16(y) && aligned16(fn) && (y_bf16 || D % 4 == 0) &&
         (!bc || aligned16(bc));
}
void hc_post_coeff(float* x, const float* coeff, const void* y, bool y_bf16, int N, int64_t T, int64_t D, const float* fn,
                   const float* base, const float* scale, const HcKernelParams& p, float* coeff_next, cudaStream_t s,
                   const float* bc) {
  if (T <= 0) return;
  DZ_CHECK(hc_post_coeff_fits(N, D, x, y, y_bf16, fn, bc) && p.N == N, "hc_post_coeff: N = ", N, ", D = ", D,
           " or the operands' alignment outside what the fused kernel takes (hc_post_coeff_fits)");
  DZ_CHECK(D > 0 && (T + kPT - 1) / kPT < (int64_t(1) << 31), "hc_post_coeff: ", T, " tokens");
  DZ_CHECK(aligned16(coeff) && aligned16(coeff_next), "hc_post_coeff: coefficients not 16-byte aligned");
  const unsigned blocks = unsigned((T + kPT - 1) / kPT);
  if (y_bf16)
    k_hc_post_coeff4<true><<<blocks, kThr, 0, s>>>(x, bc, coeff, y, fn, T, D, base, scale, p, coeff_next);
  else
    k_hc_post_coeff4<false><<<blocks, kThr, 0, s>>>(x, bc, coeff, y, fn, T, D, base, scale, p, coeff_next);
  CUDA_CHECK_LAUNCH();
}
void hc_collapse_norm(const float* x, const float* coeff, int N, int64_t T, int64_t D, const float* w, float eps, bool zc,
                      void* out, bool out_bf16, cudaStream_t s) {
  if (T <= 0) return;
  DZ_CHECK(N == 4 && D % 4 == 0 && D > 0, "hc_collapse_norm: N = ", N, ", D = ", D, " (N = 4, D % 4 == 0)");
  DZ_CHECK(T < (int64_t(1) << 31), "hc_collapse_norm: ", T, " tokens (< 2^31)");
  DZ_CHECK(aligned16(x) && aligned16(coeff) && (!w || aligned16(w)) &&
               (reinterpret_cast<uintptr_t>(out) & (out_bf16 ? 7 : 15)) == 0,
           "hc_collapse_norm: operands not aligned for 16-byte loads");
  if (out_bf16)
    k_hc_collapse_norm4<__nv_bfloat16><<<unsigned(T), kThr, 0, s>>>(x, coeff, w, eps, zc, D, static_cast<__nv_bfloat16*>(out));
  else
    k_hc_collapse_norm4<float><<<unsigned(T), kThr, 0, s>>>(x, coeff, w, eps, zc, D, static_cast<float*>(out));
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
void hc_fn_sum(const float* fn, int64_t C, int N, int64_t D, float* fs, cudaStream_t s) {
  if (C * D <= 0) return;
  const int64_t blocks = std::min<int64_t>((C * D + 255) / 256, 4096);
  k_hc_fn_sum<<<unsigned(blocks), 256, 0, s>>>(fn, C, N, D, fs);
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
