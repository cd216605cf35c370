// The vectorised norms / adds experiment (norms_vec.cuh says what and why).
#include "norms_vec.cuh"

#include <cmath>
#include <type_traits>

#include "common.cuh"

namespace dz::cuda::dev {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 8;  // warps per block (norms)
constexpr int kCache = 8;  // 8-element chunks per lane kept in registers between the passes

// 8 consecutive elements <-> 8 floats (16 bytes of bf16, 32 of fp32).
template <class T>
struct V8;
template <>
struct V8<float> {
  __device__ static void ld(const float* p, float (&v)[8]) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  __device__ static void st(float* p, const float (&v)[8]) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
  }
};
template <>
struct V8<bf16> {
  __device__ static void ld(const bf16* p, float (&v)[8]) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      v[2 * i] = f.x, v[2 * i + 1] = f.y;
    }
  }
  __device__ static void st(bf16* p, const float (&v)[8]) {
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<uint4*>(p) = u;
  }
};

__device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + expf(-x)); }

// Sum over the L lanes of a row (L a power of two <= 32; every lane of the warp takes part).
template <int L>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = L / 2; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, L);
  return v;
}

// One row per L lanes. GATED: y = x * inv * w * act(gate); else y = x * inv * (w | 1 + w | 1).
template <int L, bool GATED, class TX, class TG, class TY>
__global__ void __launch_bounds__(32 * kWarps) k_norm_vec(const TX* __restrict__ x, const TG* __restrict__ gate,
                                                          const float* __restrict__ w, TY* __restrict__ y,
                                                          int64_t rows, int64_t D, float eps, bool zc, int act) {
  constexpr int RPW = 32 / L;  // rows per warp
  const int lane = threadIdx.x & 31, sl = lane % L;
  const int64_t r = (int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * RPW + lane / L;
  const bool ok = r < rows;  // lanes of rows past the end still join the shuffles
  const int64_t nc = D / 8;
  const TX* xr = x + (ok ? r : 0) * D;
  float xc[kCache][8];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int64_t c = sl + int64_t(L) * j;
    if (ok && c < nc) {
      V8<TX>::ld(xr + c * 8, xc[j]);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += xc[j][i] * xc[j][i];
    }
  }
  for (int64_t c = sl + int64_t(L) * kCache; ok && c < nc; c += L) {
    float v[8];
    V8<TX>::ld(xr + c * 8, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
  }
  ss = group_sum<L>(ss);
  if (!ok) return;
  const float inv = 1.f / sqrtf(ss / float(D) + eps);
  TY* yr = y + r * D;
  const TG* gr = GATED ? gate + r * D : nullptr;
  auto out = [&](int64_t c, float (&v)[8]) {
    float wv[8];
    if (w) {
      V8<float>::ld(w + c * 8, wv);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) wv[i] = 1.f;
    }
    if constexpr (GATED) {
      float g[8];
      V8<TG>::ld(gr + c * 8, g);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float a = act == 0 ? g[i] / (1.f + expf(-g[i])) : sigm(g[i]);
        v[i] = v[i] * inv * wv[i] * a;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = v[i] * inv * (zc && w ? 1.f + wv[i] : wv[i]);
    }
    V8<TY>::st(yr + c * 8, v);
  };
#pragma unroll
  for (int j = 0; j < kCache; ++j) {
    const int64_t c = sl + int64_t(L) * j;
    if (c < nc) out(c, xc[j]);
  }
  for (int64_t c = sl + int64_t(L) * kCache; c < nc; c += L) {
    float v[8];
    V8<TX>::ld(xr + c * 8, v);
    out(c, v);
  }
}

template <class TH, class TY>
__global__ void k_add_vec(TH* __restrict__ h, const TY* __restrict__ y, int64_t n8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    float a[8], b[8];
    V8<TH>::ld(h + i * 8, a);
    V8<TY>::ld(y + i * 8, b);
#pragma unroll
    for (int k = 0; k < 8; ++k) a[k] += b[k];
    V8<TH>::st(h + i * 8, a);
  }
}

// One block per token (256 threads); D % 8 == 0.
__global__ void __launch_bounds__(256) k_shared_add_vec(const bf16* __restrict__ x, const float* __restrict__ gate,
                                                        const bf16* __restrict__ sh, int64_t D, bf16* __restrict__ y) {
  __shared__ float part[8];
  const int64_t t = blockIdx.x, nc = D / 8;
  float g = 1.f;
  if (gate) {
    float d = 0.f;
    for (int64_t c = threadIdx.x; c < nc; c += 256) {
      float xv[8], gv[8];
      V8<bf16>::ld(x + t * D + c * 8, xv);
      V8<float>::ld(gate + c * 8, gv);
#pragma unroll
      for (int i = 0; i < 8; ++i) d += xv[i] * gv[i];
    }
    d = group_sum<32>(d);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = d;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) tot += part[i];  // warps ascending: deterministic
    g = sigm(tot);
  }
  for (int64_t c = threadIdx.x; c < nc; c += 256) {
    float yv[8], sv[8];
    V8<bf16>::ld(y + t * D + c * 8, yv);
    V8<bf16>::ld(sh + t * D + c * 8, sv);
#pragma unroll
    for (int i = 0; i < 8; ++i) yv[i] += g * sv[i];
    V8<bf16>::st(y + t * D + c * 8, yv);
  }
}

template <bool GATED, class TX, class TG, class TY>
bool launch_norm(const TX* x, const TG* gate, const float* w, TY* y, int64_t rows, int64_t D, float eps, bool zc,
                 int act, cudaStream_t s) {
  if (D % 8 != 0 || D < 32 || !aligned16(x) || !aligned16(y) || (w && !aligned16(w)) || (GATED && !aligned16(gate)))
    return false;
  if (rows <= 0) return true;
  const int64_t nc = D / 8;
  const int L = nc >= 32 ? 32 : nc >= 16 ? 16 : nc >= 8 ? 8 : 4;
  const int64_t rows_per_block = int64_t(kWarps) * (32 / L);
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  DZ_CHECK(blocks < (int64_t(1) << 31), "norm_vec: ", rows, " rows");
  const dim3 grid{unsigned(blocks)}, block{32 * kWarps};
  switch (L) {
    case 32: k_norm_vec<32, GATED><<<grid, block, 0, s>>>(x, gate, w, y, rows, D, eps, zc, act); break;
    case 16: k_norm_vec<16, GATED><<<grid, block, 0, s>>>(x, gate, w, y, rows, D, eps, zc, act); break;
    case 8: k_norm_vec<8, GATED><<<grid, block, 0, s>>>(x, gate, w, y, rows, D, eps, zc, act); break;
    default: k_norm_vec<4, GATED><<<grid, block, 0, s>>>(x, gate, w, y, rows, D, eps, zc, act); break;
  }
  CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace

template <class TX, class TY>
bool rmsnorm_vec(const TX* x, const float* w, TY* y, int64_t rows, int64_t D, float eps, bool zc, cudaStream_t s) {
  return launch_norm<false>(x, static_cast<const bf16*>(nullptr), w, y, rows, D, eps, zc, 0, s);
}
template <class TX, class TG, class TY>
bool gated_rmsnorm_vec(const TX* x, const TG* gate, const float* w, TY* y, int64_t rows, int64_t D, float eps, int act,
                       cudaStream_t s) {
  if (!w) return false;  // production's gated norm always has a weight
  return launch_norm<true>(x, gate, w, y, rows, D, eps, false, act, s);
}
template <class TH, class TY>
bool add_vec(TH* h, const TY* y, int64_t n, cudaStream_t s) {
  if (n % 8 != 0 || !aligned16(h) || !aligned16(y)) return false;
  if (n <= 0) return true;
  const int64_t n8 = n / 8, b = (n8 + 255) / 256;
  k_add_vec<<<unsigned(b < 65535 * 16 ? b : 65535 * 16), 256, 0, s>>>(h, y, n8);
  CUDA_CHECK_LAUNCH();
  return true;
}
bool shared_expert_add_vec(const bf16* x, const float* gate, const bf16* sh, int64_t T, int64_t D, bf16* y,
                           cudaStream_t s) {
  if (D % 8 != 0 || !aligned16(x) || !aligned16(sh) || !aligned16(y) || (gate && !aligned16(gate))) return false;
  if (T <= 0) return true;
  k_shared_add_vec<<<unsigned(T), 256, 0, s>>>(x, gate, sh, D, y);
  CUDA_CHECK_LAUNCH();
  return true;
}

template bool rmsnorm_vec<float, bf16>(const float*, const float*, bf16*, int64_t, int64_t, float, bool, cudaStream_t);
template bool rmsnorm_vec<bf16, bf16>(const bf16*, const float*, bf16*, int64_t, int64_t, float, bool, cudaStream_t);
template bool rmsnorm_vec<float, float>(const float*, const float*, float*, int64_t, int64_t, float, bool, cudaStream_t);
template bool gated_rmsnorm_vec<bf16, bf16, bf16>(const bf16*, const bf16*, const float*, bf16*, int64_t, int64_t,
                                                  float, int, cudaStream_t);
template bool add_vec<float, bf16>(float*, const bf16*, int64_t, cudaStream_t);
template bool add_vec<float, float>(float*, const float*, int64_t, cudaStream_t);
template bool add_vec<bf16, bf16>(bf16*, const bf16*, int64_t, cudaStream_t);

}  // namespace dz::cuda::dev
