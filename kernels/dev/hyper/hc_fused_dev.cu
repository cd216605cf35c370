// Experiment (issue 11, after 4fb12a5): mHC's per-sub-layer kernels at GLM-5.3-Flash's shape
// (N = 4, D = 4096, T = 8192) take k_hc_post_proj4 0.47 ms and k_hc_pre 0.31 ms a call (H200,
// docs/perf/experiments_2026-12-03c.txt), against memory floors of ~0.24 and ~0.14 ms. Two
// questions for one device command (kernels/dev/hyper/run.sh):
//   1. how much of the fused post + projection is its projection: PROJ = false skips phase 2
//      (the products; what is left is production's memory traffic and barriers);
//   2. the coefficients in the fused kernel's epilogue (COEF: a warp per token, 8 warps x 2 tokens,
//      hc_coeffs_warp as k_hc_pre's warp 0) and a streaming collapse (k_collapse4, a thread per
//      16 bytes) instead of k_hc_pre's block per token, whose warps wait for warp 0's 20 Sinkhorn
//      iterations before the collapse.
//   3. the collapse fused with the RMSNorm that follows it (k_collapse_norm4: only the bf16 normed
//      row is written; production writes `in` in fp32 and k_rmsnorm8 reads it back).
// The kernels are production's k_hc_post_proj4 (kernels/hyper.cu) with those switches; with
// PROJ and COEF the outputs must equal production's bitwise (same products, same order, the same
// coefficient code), which the harness checks, beside an fp64 reference on sampled tokens.
// Written 2026-12-03 after the session's device time was spent: compiled, NOT yet run.
#include <cuda_bf16.h>

#include "common.cuh"
#include "hyper.cuh"
#include "hyper_coeffs.cuh"

namespace dz::cuda::dev {

namespace {
constexpr int kThr = 256;
constexpr int kPT = 16, kDC = 128;
template <bool YB, bool PROJ, bool COEF>
__global__ void __launch_bounds__(kThr, 2) k_post_proj4(float* x, const float* coeff, const void* y, const float* fn,
                                                      int64_t T, int64_t D, float* m, float* ss_out, const float* base,
                                                      const float* scale, HcKernelParams p, float* coeff_out) {
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
    for (int n = 0; n < (PROJ ? N : 0); ++n) {
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
  // Σx² of token tt over its 16 threads (lanes 16·h .. 16·h + 15 of one warp)
#pragma unroll
  for (int o = 8; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if constexpr (!COEF) {
#pragma unroll
    for (int a = 0; a < 8; ++a)
#pragma unroll
      for (int b = 0; b < 6; ++b)
        if (lane == ((b * 8 + a) & 31) && t0 + q0 + a < T) m[(t0 + q0 + a) * C + c0 + b] = acc[a][b];
    if ((threadIdx.x & 15) == 0 && live) ss_out[t] = ss;
  } else {
    // the coefficients here: m and Σx² of the block's 16 tokens into shared memory (the tile is
    // free now), then warp w takes tokens 2w and 2w + 1 (hc_coeffs_warp, as k_hc_pre's warp 0)
    float* mm = &X[0][0];            // [kPT][C]
    float* sq = &X[0][0] + kPT * C;  // [kPT]
    float* scr = sq + kPT + warp * C;  // this warp's scratch [C]
#pragma unroll
    for (int a = 0; a < 8; ++a)
#pragma unroll
      for (int b = 0; b < 6; ++b)
        if (lane == ((b * 8 + a) & 31)) mm[(q0 + a) * C + c0 + b] = acc[a][b];
    if ((threadIdx.x & 15) == 0) sq[tt] = ss;
    __syncthreads();
#pragma unroll 1
    for (int k = 0; k < 2; ++k) {
      const int q = 2 * warp + k;
      if (t0 + q >= T) break;
      const float r = rsqrtf(sq[q] / float(N * D) + p.eps_norm);
      hc_coeffs_warp<N>(mm + q * C, r, base, scale, p, lane, scr, coeff_out + (t0 + q) * C);
      __syncwarp();
    }
  }
}

// in [T, D] = Σ_n pre[n] x[t, n, :] (n ascending, as k_hc_pre), pre from coeff: a thread per 16 bytes.
__global__ void k_collapse4(const float* x, const float* coeff, int64_t T, int64_t D, float* in) {
  constexpr int N = 4, C = (2 + N) * N;
  const int64_t n4 = D / 4, total = T * n4;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / n4, c = i % n4;
    const float4 pre = *reinterpret_cast<const float4*>(coeff + t * C);
    const float* xt = x + t * N * D + 4 * c;
    float4 v[N];
#pragma unroll
    for (int n = 0; n < N; ++n) v[n] = *reinterpret_cast<const float4*>(xt + n * D);
    const float pw[N] = {pre.x, pre.y, pre.z, pre.w};
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      o.x += pw[n] * v[n].x;
      o.y += pw[n] * v[n].y;
      o.z += pw[n] * v[n].z;
      o.w += pw[n] * v[n].w;
    }
    *reinterpret_cast<float4*>(in + t * D + 4 * c) = o;
  }
}


// The collapse fused with the sub-layer's RMSNorm (what the backend runs next on `in`): one block
// per token, each thread 4 16-byte chunks of each stream (D == 4096), in kept in registers, the
// row's Σ in² by a block reduction, then out = bf16(in · rsqrt(mean in² + eps) · w). Writes only
// the normed bf16 row: the fp32 `in` is neither written nor read again.
__global__ void __launch_bounds__(256) k_collapse_norm4(const float* x, const float* coeff, const float* w, float eps,
                                                        int64_t D, __nv_bfloat16* out) {
  constexpr int N = 4, C = (2 + N) * N, CPT = 4;
  const int64_t t = blockIdx.x;
  const float4 pre = *reinterpret_cast<const float4*>(coeff + t * C);
  const float pw[N] = {pre.x, pre.y, pre.z, pre.w};
  const float* xt = x + t * N * D;
  float4 v[CPT][N];
#pragma unroll
  for (int j = 0; j < CPT; ++j)
#pragma unroll
    for (int n = 0; n < N; ++n) v[j][n] = *reinterpret_cast<const float4*>(xt + n * D + 4 * (threadIdx.x + 256 * j));
  float4 o[CPT];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < CPT; ++j) {
    o[j] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      o[j].x += pw[n] * v[j][n].x;
      o[j].y += pw[n] * v[j][n].y;
      o[j].z += pw[n] * v[j][n].z;
      o[j].w += pw[n] * v[j][n].w;
    }
    ss += o[j].x * o[j].x + o[j].y * o[j].y + o[j].z * o[j].z + o[j].w * o[j].w;
  }
  __shared__ float red[8];
  for (int off = 16; off; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) tot += red[i];
  const float inv = 1.f / sqrtf(tot / float(D) + eps);
#pragma unroll
  for (int j = 0; j < CPT; ++j) {
    const int64_t c = 4 * (threadIdx.x + 256 * j);
    const float4 wv = *reinterpret_cast<const float4*>(w + c);
    const __nv_bfloat162 a = __floats2bfloat162_rn(o[j].x * inv * wv.x, o[j].y * inv * wv.y);
    const __nv_bfloat162 b = __floats2bfloat162_rn(o[j].z * inv * wv.z, o[j].w * inv * wv.w);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t*>(&a);
    u.y = *reinterpret_cast<const uint32_t*>(&b);
    *reinterpret_cast<uint2*>(out + t * D + c) = u;
  }
}

}  // namespace

// mode 0: PROJ, no COEF (m, ss as production); 1: PROJ + COEF (coeff_out); 2: no PROJ (x and ss only)
void hc_post_proj_dev(int mode, float* x, const float* coeff, const __nv_bfloat16* y, const float* fn, int64_t T,
                      int64_t D, float* m, float* ss, const float* base, const float* scale, const HcKernelParams& p,
                      float* coeff_out, cudaStream_t s) {
  const unsigned blocks = unsigned((T + kPT - 1) / kPT);
  if (mode == 0)
    k_post_proj4<true, true, false><<<blocks, kThr, 0, s>>>(x, coeff, y, fn, T, D, m, ss, base, scale, p, coeff_out);
  else if (mode == 1)
    k_post_proj4<true, true, true><<<blocks, kThr, 0, s>>>(x, coeff, y, fn, T, D, m, ss, base, scale, p, coeff_out);
  else
    k_post_proj4<true, false, false><<<blocks, kThr, 0, s>>>(x, coeff, y, fn, T, D, m, ss, base, scale, p, coeff_out);
  CUDA_CHECK_LAUNCH();
}
void hc_collapse_dev(const float* x, const float* coeff, int64_t T, int64_t D, float* in, cudaStream_t s) {
  const int64_t n = T * (D / 4);
  k_collapse4<<<unsigned(std::min<int64_t>((n + 255) / 256, 132 * 16)), 256, 0, s>>>(x, coeff, T, D, in);
  CUDA_CHECK_LAUNCH();
}

void hc_collapse_norm_dev(const float* x, const float* coeff, const float* w, float eps, int64_t T, int64_t D,
                          __nv_bfloat16* out, cudaStream_t s) {
  DZ_CHECK(D == 4096, "hc_collapse_norm_dev: D = 4096 only (4 chunks a thread)");
  k_collapse_norm4<<<unsigned(T), 256, 0, s>>>(x, coeff, w, eps, D, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda::dev
