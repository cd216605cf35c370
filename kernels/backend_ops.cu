// The CUDA backend's own ops (see backend_ops.cuh), in plain SIMT: elementwise ops, norms and
// reductions are memory-bound anyway. Dense attention (flash_attention.cu) and the grouped expert
// GEMMs (moe_gemm.cu) have their own tensor-core kernels; the warp-per-query attention here serves
// the DSA selection and head dims over 256.
#include <cuda_fp8.h>

#include <cfloat>
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "backend_ops.cuh"
#include "common.cuh"
#include "glu.cuh"

namespace dz::cuda {

namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float ldv(const void* p, Dt dt, int64_t i) {
  return dt == Dt::F32 ? static_cast<const float*>(p)[i] : __bfloat162float(static_cast<const bf16*>(p)[i]);
}
__device__ __forceinline__ void stv(void* p, Dt dt, int64_t i, float v) {
  if (dt == Dt::F32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<bf16*>(p)[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part/total may still be read by a previous call
  if (lane == 0) part[w] = v;
  __syncthreads();
  if (w == 0) {
    float t = lane < nw ? part[lane] : 0.f;
    t = warp_sum(t);
    if (lane == 0) total = t;
  }
  __syncthreads();
  return total;
}

unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 65535 * 16 ? (b < 1 ? 1 : b) : 65535 * 16);
}

// ---- elementwise ----
__global__ void k_convert(const void* src, Dt sdt, void* dst, Dt ddt, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    stv(dst, ddt, i, ldv(src, sdt, i));
}
// w = hi + mid + lo exactly: each term is the bf16 rounding of what the terms before it left (the
// residual of an fp32 value after k bf16 terms has at most 24 - 8k significant bits).
__global__ void k_split_bf16x3(const float* w, int64_t n, bf16* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = w[i];
    const bf16 hi = __float2bfloat16_rn(v);
    const float r1 = v - __bfloat162float(hi);
    const bf16 mid = __float2bfloat16_rn(r1);
    out[i] = hi;
    out[n + i] = mid;
    out[2 * n + i] = __float2bfloat16_rn(r1 - __bfloat162float(mid));
  }
}
// The same split, row-interleaved smallest first: out [rows, 3D] = (lo | mid | hi) of w [rows, D], so
// one GEMM over K = 3D against operands replicated three times sums the three products.
__global__ void k_split_bf16x3_rows(const float* w, int64_t rows, int64_t D, bf16* out) {
  const int64_t n = rows * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = w[i];
    const bf16 hi = __float2bfloat16_rn(v);
    const float r1 = v - __bfloat162float(hi);
    const bf16 mid = __float2bfloat16_rn(r1);
    bf16* o = out + (i / D) * 3 * D + i % D;
    o[0] = __float2bfloat16_rn(r1 - __bfloat162float(mid));
    o[D] = mid;
    o[2 * D] = hi;
  }
}
// out [R, k·C] = each row of x [R, C] k times; 16-byte chunks (C % 8 == 0, aligned) or elements.
template <typename E>
__global__ void k_repeat_cols(const E* x, int64_t R, int64_t C, int k, E* out) {
  const int64_t n = R * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const E v = x[i];
    E* o = out + (i / C) * k * C + i % C;
    for (int j = 0; j < k; ++j) o[j * C] = v;
  }
}
// One CTA row (blockIdx.y) per copy; the CTAs of a row stride over its 16-byte words.
__global__ void k_copy_many(const CopyDesc* descs) {
  const CopyDesc d = descs[blockIdx.y];
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, i0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (((reinterpret_cast<uintptr_t>(d.src) | reinterpret_cast<uintptr_t>(d.dst) | d.bytes) & 15) == 0) {
    const uint4* s = static_cast<const uint4*>(d.src);
    uint4* o = static_cast<uint4*>(d.dst);
    for (int64_t i = i0; i < int64_t(d.bytes / 16); i += stride) o[i] = s[i];
  } else {
    const unsigned char* s = static_cast<const unsigned char*>(d.src);
    unsigned char* o = static_cast<unsigned char*>(d.dst);
    for (int64_t i = i0; i < int64_t(d.bytes); i += stride) o[i] = s[i];
  }
}
__global__ void k_fill_dummy(void* y, Dt dt, int64_t R, int64_t C, uint64_t key, DummyDist d, int64_t ld, int64_t r0,
                             int64_t c0) {
  const int64_t n = R * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    stv(y, dt, i, dummy_value(key, uint64_t((r0 + i / C) * ld + c0 + i % C), d));
}
// One thread per group of 32: the MXFP4 codes of dummy values (core/dummy_values.hpp), packed two a
// byte (even element low) with the group's E8M0 scale, for expert stacks [E, R, C] of keys[e].
__global__ void k_dummy_mx4(uint8_t* packed, uint8_t* scales, const uint64_t* keys, int64_t E, int64_t R, int64_t C,
                            DummyDist d, int64_t ld, int64_t r0, int64_t c0) {
  const int64_t G = C / 32, n = E * R * G;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i / (R * G), r = (i / G) % R, g = i % G;
    uint8_t codes[32], sc;
    dummy_mx4_group(keys[e], uint64_t((r0 + r) * ld + c0 + g * 32), d, codes, &sc);
    uint8_t* p = packed + i * 16;
#pragma unroll
    for (int j = 0; j < 16; ++j) p[j] = uint8_t(codes[2 * j] | (codes[2 * j + 1] << 4));
    scales[i] = sc;
  }
}
__global__ void k_set_i32(int32_t* dst, int n, SmallI32 v) {
  if (threadIdx.x < n) dst[threadIdx.x] = v.v[threadIdx.x];
}
__global__ void k_iota_i32(int32_t* dst, int64_t n, int32_t start) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = start + int32_t(i);
}
__global__ void k_embed(const void* table, Dt tdt, const int32_t* ids, int64_t T, int64_t D, float* out) {
  const int64_t n = T * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    out[i] = ldv(table, tdt, int64_t(ids[t]) * D + d);
  }
}
// Row copies (gather, embedding): a warp per row, kRowU 16-byte loads of a lane in flight at once.
constexpr int kRowU = 8, kRowWarps = 8;
// A row of n16 16-byte vectors read by one warp, kRowU loads of a lane in flight before any f(d, v).
template <class F>
__device__ __forceinline__ void each_row16(const uint4* __restrict__ src, int64_t n16, int lane, F&& f) {
  for (int64_t d0 = 0; d0 < n16; d0 += 32 * kRowU) {
    uint4 v[kRowU];
#pragma unroll
    for (int u = 0; u < kRowU; ++u) {
      const int64_t d = d0 + lane + 32 * u;
      if (d < n16) v[u] = __ldg(src + d);
    }
#pragma unroll
    for (int u = 0; u < kRowU; ++u) {
      const int64_t d = d0 + lane + 32 * u;
      if (d < n16) f(d, v[u]);
    }
  }
}
// BF16 table, D % 8 == 0, 16-byte aligned: a warp per token, kRowU 16-byte loads in flight per lane
// (the grid-stride k_embed above moved ~1.2 TB/s: 0.17 ms at GLM-5.3-Flash's T = 8192, D = 4096).
__global__ void __launch_bounds__(32 * kRowWarps) k_embed8(const uint4* table, const int32_t* ids, int64_t T, int64_t D8,
                                                           float4* out) {
  const int64_t t = blockIdx.x * int64_t(kRowWarps) + (threadIdx.x >> 5);
  if (t >= T) return;
  float4* dst = out + t * D8 * 2;
  each_row16(table + int64_t(ids[t]) * D8, D8, threadIdx.x & 31, [&](int64_t d, const uint4& v) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    dst[2 * d] = make_float4(__uint_as_float(w[0] << 16), __uint_as_float(w[0] & 0xffff0000u),
                             __uint_as_float(w[1] << 16), __uint_as_float(w[1] & 0xffff0000u));
    dst[2 * d + 1] = make_float4(__uint_as_float(w[2] << 16), __uint_as_float(w[2] & 0xffff0000u),
                                 __uint_as_float(w[3] << 16), __uint_as_float(w[3] & 0xffff0000u));
  });
}
__global__ void k_add(void* h, Dt hdt, const void* y, Dt ydt, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    stv(h, hdt, i, ldv(h, hdt, i) + ldv(y, ydt, i));
}
__global__ void k_mul_sigmoid(void* x, Dt xdt, const void* g, Dt gdt, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    stv(x, xdt, i, ldv(x, xdt, i) * sigm(ldv(g, gdt, i)));
}
__global__ void k_add_bias(void* y, Dt ydt, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    stv(y, ydt, i, ldv(y, ydt, i) + bias[i % cols]);
}
// L > 0: the SwiGLU clamp silu(min(g, L)) * clamp(u, -L, L); 0: none (NaNs pass as they are).
__device__ __forceinline__ float silu_mul1(float a, float b, const GluAct& act) {
  if (act.situ_beta > 0.f) return glu_dev(act, a, b);
  // SwiGLU (and its clamp) with the accurate expf, as before
  if (act.limit > 0.f) a = fminf(a, act.limit), b = fminf(fmaxf(b, -act.limit), act.limit);
  return a / (1.f + expf(-a)) * b;
}
__global__ void k_silu_mul(const bf16* g, const bf16* u, bf16* h, int64_t n, GluAct act) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    h[i] = __float2bfloat16_rn(silu_mul1(__bfloat162float(g[i]), __bfloat162float(u[i]), act));
}
// 8 elements a thread with 16-byte loads and stores (the MoE experts' [rows, I] pass is
// bandwidth-bound); n8 = n / 8 chunks, the tail by k_silu_mul.
__global__ void k_silu_mul8(const uint4* g, const uint4* u, uint4* h, int64_t n8, GluAct act) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 gv = g[i], uv = u[i];
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
    const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv);
    uint4 out;
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 a = __bfloat1622float2(g2[j]), b = __bfloat1622float2(u2[j]);
      o2[j] = __floats2bfloat162_rn(silu_mul1(a.x, b.x, act), silu_mul1(a.y, b.y, act));
    }
    h[i] = out;
  }
}

// ---- norms: one warp per row, 8 rows per block ----
// A warp per row: no shared memory or block barriers, and every row shape (D = 128 heads of a
// gated norm, 262144 of them at T = 8192, or D = 2048 hidden rows) keeps the SMs full. The
// previous block-per-row kernels (64 or 256 threads, a block reduction) ran at 1 / 3 of the
// bandwidth on the H200 for the gated D = 128 rows (ncu, Qwen3.5 at T = 8192: 180 us a call).
// Templated on the element types so that the loads are plain (the dtype switch of ldv / stv was
// per element); the second pass re-reads x from L1 / L2.
constexpr int kNormWarps = 8;
template <class T>
__device__ __forceinline__ float ldf(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) return p[i];
  else return __bfloat162float(p[i]);
}
template <class T>
__device__ __forceinline__ void stf(T* p, int64_t i, float v) {
  if constexpr (std::is_same_v<T, float>) p[i] = v;
  else p[i] = __float2bfloat16_rn(v);
}
// 1 / sqrt(mean(x^2) + eps) of a row of D values, every lane of the warp taking part.
template <class TX>
__device__ __forceinline__ float warp_inv_rms(const TX* xr, int64_t D, float eps, int lane) {
  float ss = 0.f;
#pragma unroll 4
  for (int64_t d = lane; d < D; d += 32) {
    const float v = ldf(xr, d);
    ss += v * v;
  }
  ss = warp_sum(ss);
  return 1.f / sqrtf(ss / float(D) + eps);
}
template <class TX, class TY>
__global__ void __launch_bounds__(32 * kNormWarps) k_rmsnorm(const TX* x, const float* w, TY* y, int64_t rows,
                                                              int64_t D, float eps, bool zc) {
  const int64_t r = int64_t(blockIdx.x) * kNormWarps + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const TX* xr = x + r * D;
  const float inv = warp_inv_rms(xr, D, eps, lane);
  TY* yr = y + r * D;
#pragma unroll 4
  for (int64_t d = lane; d < D; d += 32) {
    const float wv = w ? (zc ? 1.f + w[d] : w[d]) : 1.f;
    stf(yr, d, ldf(xr, d) * inv * wv);
  }
}
template <class TX, class TG, class TY>
__global__ void __launch_bounds__(32 * kNormWarps) k_gated_rmsnorm(const TX* x, const TG* gate, const float* w, TY* y,
                                                                    int64_t rows, int64_t D, float eps, int act) {
  const int64_t r = int64_t(blockIdx.x) * kNormWarps + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const TX* xr = x + r * D;
  const float inv = warp_inv_rms(xr, D, eps, lane);
  const TG* gr = gate + r * D;
  TY* yr = y + r * D;
#pragma unroll 4
  for (int64_t d = lane; d < D; d += 32) {
    const float g = ldf(gr, d);
    const float a = act == 0 ? g / (1.f + expf(-g)) : sigm(g);
    stf(yr, d, ldf(xr, d) * inv * w[d] * a);
  }
}
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

// Head-size rows (D = 64, 128, 256: the q / k head norms and the linear-attention output's gated
// norm, gate == nullptr for the plain one): LPR = D / 8 lanes per row, 32 / LPR rows per warp, 8
// elements a lane in one 16-byte load kept in registers; the row's sum of squares by xor shuffles
// inside its lane group. (A warp per row, as k_rmsnorm / k_gated_rmsnorm, leaves lanes on 2-byte
// loads: the gated norm of Qwen3.5's [32768 x 32, 128] ran at ~1.6 TB/s, 0.49 ms; a 16-byte version
// with one row per warp idled half its lanes and was slower still.)
template <int LPR, class TX, class TG, class TY>
__global__ void __launch_bounds__(32 * kNormWarps) k_norm_rows8(const TX* x, const TG* gate, const float* w, TY* y,
                                                                int64_t rows, float eps, bool zc, int act) {
  constexpr int D = LPR * 8;
  const int lane = threadIdx.x & 31;
  const int64_t r = (int64_t(blockIdx.x) * kNormWarps + (threadIdx.x >> 5)) * (32 / LPR) + lane / LPR;
  const int c = (lane % LPR) * 8;
  const bool ok = r < rows;
  // every load issued before the reduction (the gate's and the weight's after it left a second
  // memory latency exposed per row)
  float v[8], wv[8], g[8];
  if (ok) {
    V8<TX>::ld(x + r * D + c, v);
    if (gate) V8<TG>::ld(gate + r * D + c, g);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.f;
  }
  if (w) {
    V8<float>::ld(w + c, wv);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) wv[i] = zc ? 0.f : 1.f;
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
#pragma unroll
  for (int o = LPR / 2; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (!ok) return;
  const float inv = 1.f / sqrtf(ss / float(D) + eps);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (gate) {
      const float a = act == 0 ? g[i] / (1.f + expf(-g[i])) : sigm(g[i]);
      v[i] = v[i] * inv * wv[i] * a;
    } else {
      v[i] = v[i] * inv * (zc ? 1.f + wv[i] : wv[i]);
    }
  }
  V8<TY>::st(y + r * D + c, v);
}
// The row kernel above for D = 64 / 128 / 256 with 16-byte aligned operands: f(lanes per row) and
// true, else false.
template <class F>
bool with_rows8(int64_t D, std::initializer_list<const void*> ps, F&& f) {
  for (const void* p : ps)
    if (p && !aligned16(p)) return false;
  if (D == 64) f(std::integral_constant<int, 8>{});
  else if (D == 128) f(std::integral_constant<int, 16>{});
  else if (D == 256) f(std::integral_constant<int, 32>{});
  else return false;
  return true;
}
// x *= sigmoid(g), 8 elements a thread (n % 8 == 0, 16-byte aligned): the attention output gate.
template <class TX, class TG>
__global__ void k_mul_sigmoid8(TX* x, const TG* g, int64_t n8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    float a[8], b[8];
    V8<TX>::ld(x + i * 8, a);
    V8<TG>::ld(g + i * 8, b);
#pragma unroll
    for (int k = 0; k < 8; ++k) a[k] = a[k] * sigm(b[k]);
    V8<TX>::st(x + i * 8, a);
  }
}

// Hidden-size rows (D >= 1024, D % 8 == 0, 16-byte aligned): a warp per row as k_rmsnorm, but 8
// elements a lane per load and the lane's first kNormCache chunks kept in registers for the second
// pass (D <= 2048: the whole row; the rest is re-read). Sum per lane over its chunks ascending,
// then a butterfly: fixed, so deterministic. 1.72x / 1.49x k_rmsnorm's speed at T = 32768, D = 2048
// / 4096 (3.17 / 2.81 TB/s); at D = 256 or 128 it was slower (0.45x), so short rows keep k_rmsnorm
// (docs/perf/experiments_697349f.txt). y may be x (each lane reads a chunk before writing it).
constexpr int kNormCache = 8;
template <class TX, class TY>
__global__ void __launch_bounds__(32 * kNormWarps) k_rmsnorm8(const TX* x, const float* __restrict__ w, TY* y,
                                                               int64_t rows, int64_t D, float eps, bool zc) {
  const int64_t r = int64_t(blockIdx.x) * kNormWarps + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t nc = D / 8;
  const TX* xr = x + r * D;
  float xc[kNormCache][8];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kNormCache; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < nc) {
      V8<TX>::ld(xr + c * 8, xc[j]);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += xc[j][i] * xc[j][i];
    }
  }
  for (int64_t c = lane + 32 * kNormCache; c < nc; c += 32) {
    float v[8];
    V8<TX>::ld(xr + c * 8, v);
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
  }
  ss = warp_sum(ss);
  const float inv = 1.f / sqrtf(ss / float(D) + eps);
  TY* yr = y + r * D;
  auto out = [&](int64_t c, float (&v)[8]) {
    float wv[8];
    if (w) {
      V8<float>::ld(w + c * 8, wv);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) wv[i] = 1.f;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = v[i] * inv * (zc && w ? 1.f + wv[i] : wv[i]);
    V8<TY>::st(yr + c * 8, v);
  };
#pragma unroll
  for (int j = 0; j < kNormCache; ++j) {
    const int64_t c = lane + 32 * j;
    if (c < nc) out(c, xc[j]);
  }
  for (int64_t c = lane + 32 * kNormCache; c < nc; c += 32) {
    float v[8];
    V8<TX>::ld(xr + c * 8, v);
    out(c, v);
  }
}
// h += y, 8 elements a thread (n % 8 == 0, 16-byte aligned): 1.31x k_add for a residual of
// T = 32768 x 2048 (3.74 TB/s).
template <class TH, class TY>
__global__ void k_add8(TH* h, const TY* __restrict__ y, int64_t n8) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n8; i += int64_t(gridDim.x) * blockDim.x) {
    float a[8], b[8];
    V8<TH>::ld(h + i * 8, a);
    V8<TY>::ld(y + i * 8, b);
#pragma unroll
    for (int k = 0; k < 8; ++k) a[k] += b[k];
    V8<TH>::st(h + i * 8, a);
  }
}

// Calls f(TypeTag) with the C++ element type of dt.
template <class F>
void with_type(Dt dt, F&& f) {
  if (dt == Dt::F32) f(static_cast<float*>(nullptr));
  else f(static_cast<bf16*>(nullptr));
}
// with_type for an f that returns a value.
template <class F>
auto with_type_r(Dt dt, F&& f) {
  return dt == Dt::F32 ? f(static_cast<float*>(nullptr)) : f(static_cast<bf16*>(nullptr));
}
// Two types at once: f(TA*, TB*) -> its value.
template <class F>
auto with_type2(Dt a, Dt b, F&& f) {
  return with_type_r(a, [&](auto* ta) { return with_type_r(b, [&](auto* tb) { return f(ta, tb); }); });
}

// ---- RoPE: one thread per (t, h, pair) ----
// Row t at position pos0 + t, or (cu set: varlen, n_seq sequences) at t - cu[b] in the sequence b
// holding it, or (rowpos set) at rowpos[t]; one rotation code for all, so a varlen or per-row call
// equals per-sequence calls bitwise.
__global__ void k_rope(void* x, Dt dt, int64_t T, int64_t H, int64_t hs, int64_t offset, int64_t pos0,
                       const int32_t* cu, int n_seq, const int32_t* rowpos, RopeParams p) {
  const int64_t n = T * H * p.half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % p.half, th = i / p.half, t = th / H;
    int64_t pos = rowpos ? int64_t(rowpos[t]) : pos0 + t;
    if (cu) {  // the last b with cu[b] <= t (skips empty sequences; cu[0] = 0)
      int lo = 0, hi = n_seq - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= t) lo = mid;
        else hi = mid - 1;
      }
      pos = t - cu[lo];
    }
    const float ang = float(pos) * p.inv_freq[j];
    const float c = float(cos(double(ang))) * p.cos_sin_mult, s = float(sin(double(ang))) * p.cos_sin_mult;
    const int64_t base = th * hs + offset;
    const int64_t a = base + (p.interleaved ? 2 * j : j), b = base + (p.interleaved ? 2 * j + 1 : j + p.half);
    const float x1 = ldv(x, dt, a), x2 = ldv(x, dt, b);
    stv(x, dt, a, x1 * c - x2 * s);
    stv(x, dt, b, x2 * c + x1 * s);
  }
}

// ---- attention: one warp per (query, head), online softmax over its keys ----
constexpr int kMaxDPerLane = 16;  // Dk, Dv <= 512
__global__ void k_attention(const bf16* q, const bf16* k, const bf16* v, bf16* out, int64_t T, int64_t pos0, int Hq,
                            int Hkv, int Dk, int Dv, float scale, const int32_t* sel, int64_t n_sel) {
  const int64_t wid = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (wid >= T * Hq) return;
  const int64_t t = wid / Hq;
  const int h = int(wid % Hq), g = h / (Hq / Hkv);
  const int64_t p = pos0 + t;  // the query's position: keys 0 .. p are visible
  float qr[kMaxDPerLane], acc[kMaxDPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDPerLane; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < Dk ? __bfloat162float(q[(t * Hq + h) * Dk + d]) : 0.f;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int64_t nk = sel ? n_sel : p + 1;
  for (int64_t j = 0; j < nk; ++j) {
    int64_t s = j;
    if (sel) {
      s = sel[t * n_sel + j];
      if (s < 0 || s > p) continue;  // masked entry (the indexer never repeats a position)
    }
    const bf16* kr = k + (s * Hkv + g) * Dk;
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxDPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < Dk) dot += qr[i] * __bfloat162float(kr[d]);
    }
    dot = warp_sum(dot) * scale;
    const float mn = fmaxf(m, dot), c = expf(m - mn), e = expf(dot - mn);
    l = l * c + e;
    const bf16* vr = v + (s * Hkv + g) * Dv;
#pragma unroll
    for (int i = 0; i < kMaxDPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < Dv) acc[i] = acc[i] * c + e * __bfloat162float(vr[d]);
    }
    m = mn;
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
  for (int i = 0; i < kMaxDPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < Dv) out[(t * Hq + h) * Dv + d] = __float2bfloat16_rn(acc[i] * inv);
  }
}

// ---- Block AttnRes: one block per token ----
constexpr int kMaxDepth = 128;
__global__ void k_attn_res_mix(const float* blocks, int64_t n, const float* partial, const float* q, int64_t T,
                               int64_t D, float eps, float* out) {
  __shared__ float w[kMaxDepth];
  const int64_t t = blockIdx.x;
  auto val = [&](int64_t i) { return i < n ? blocks + (i * T + t) * D : partial + t * D; };
  for (int64_t i = 0; i <= n; ++i) {
    const float* vi = val(i);
    float ss = 0.f, dq = 0.f;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      ss += vi[d] * vi[d];
      dq += vi[d] * q[d];
    }
    ss = block_sum(ss);
    dq = block_sum(dq);
    if (threadIdx.x == 0) w[i] = dq / sqrtf(ss / float(D) + eps);
  }
  __syncthreads();
  float m = -INFINITY;
  for (int64_t i = 0; i <= n; ++i) m = fmaxf(m, w[i]);
  float z = 0.f;
  for (int64_t i = 0; i <= n; ++i) z += expf(w[i] - m);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.f;
    for (int64_t i = 0; i <= n; ++i) o += expf(w[i] - m) / z * val(i)[d];
    out[t * D + d] = o;
  }
}

// ---- MoE ----
// One warp per token; s, c [E] and the group marks in shared memory.
__device__ bool better(float va, int ia, float vb, int ib) { return va > vb || (va == vb && ia < ib); }

__global__ void k_moe_select(const float* logits, const float* bias, int64_t T, RouteParams p, int32_t* idx, float* w,
                             int32_t* bad, const int32_t* fixed) {
  extern __shared__ float sm[];
  float* s = sm;              // [E] scores
  float* c = sm + p.E;        // [E] selection scores; taken experts set to -inf
  float* gs = sm + 2 * p.E;   // [G] group scores
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x, E = p.E, G = p.n_group, gsz = E / G;
  const float* lg = logits + t * E;
  if (p.score == 0) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lg[e]);
    mx = warp_max(mx);
    float sum = 0.f;
    for (int e = lane; e < E; e += 32) sum += (s[e] = expf(lg[e] - mx));
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) s[e] /= sum;
  } else if (p.score == 1) {
    for (int e = lane; e < E; e += 32) s[e] = sigm(lg[e]);
  } else {
    for (int e = lane; e < E; e += 32) s[e] = sqrtf(lg[e] > 20.f ? lg[e] : log1pf(expf(lg[e])));
  }
  __shared__ int picked[64];
  if (fixed) {  // hash routing: the row's experts, no selection
    __syncwarp();
    if (lane == 0) {
      for (int j = 0; j < p.top_k; ++j) {
        const int e = fixed[t * p.top_k + j];
        if (e < 0 || e >= E || !isfinite(s[e])) atomicExch(bad, 1);
        picked[j] = e < 0 || e >= E ? 0 : e;
      }
    }
    __syncwarp();
  }
  for (int e = lane; e < E && !fixed; e += 32) {
    c[e] = bias ? s[e] + bias[e] : s[e];
    if (!isfinite(c[e])) atomicExch(bad, 1);
  }
  __syncwarp();
  if (p.topk_group < G && !fixed) {
    for (int g = lane; g < G; g += 32) {
      float best = -INFINITY, second = -INFINITY;
      for (int i = 0; i < gsz; ++i) {
        const float v = c[g * gsz + i];
        if (v > best) {
          second = best;
          best = v;
        } else if (v > second) {
          second = v;
        }
      }
      gs[g] = p.top2sum ? best + second : best;
    }
    __syncwarp();
    // keep the topk_group best groups: mark the others' experts -inf
    __shared__ int keep[64];
    for (int g = lane; g < G; g += 32) keep[g] = 0;
    __syncwarp();
    for (int j = 0; j < p.topk_group; ++j) {
      float bv = -INFINITY;
      int bi = 1 << 30;
      for (int g = lane; g < G; g += 32)
        if (!keep[g] && better(gs[g], g, bv, bi)) bv = gs[g], bi = g;
      for (int o = 16; o; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
      }
      if (lane == 0 && bi < G) keep[bi] = 1;
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32)
      if (!keep[e / gsz]) c[e] = -INFINITY;
    __syncwarp();
  }
  for (int j = 0; j < p.top_k && !fixed; ++j) {
    float bv = -INFINITY;
    int bi = 1 << 30;
    for (int e = lane; e < E; e += 32)
      if (c[e] != -INFINITY && better(c[e], e, bv, bi)) bv = c[e], bi = e;
    for (int o = 16; o; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) {
      picked[j] = bi < E ? bi : 0;
      if (bi < E) c[bi] = -INFINITY;
    }
    __syncwarp();
  }
  if (lane == 0) {
    for (int a = 1; a < p.top_k; ++a)  // ascending expert index
      for (int b = a; b > 0 && picked[b] < picked[b - 1]; --b) {
        const int x = picked[b];
        picked[b] = picked[b - 1];
        picked[b - 1] = x;
      }
    float sum = 0.f;
    for (int j = 0; j < p.top_k; ++j) sum += s[picked[j]];
    for (int j = 0; j < p.top_k; ++j) {
      float v = s[picked[j]];
      if (p.norm_topk_prob) v /= (sum + 1e-20f);
      idx[t * p.top_k + j] = picked[j];
      w[t * p.top_k + j] = v * p.scaling;
    }
  }
}

__global__ void k_count(const int32_t* idx, int64_t n, int32_t* counts) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(&counts[idx[i]], 1);
}
// Exclusive prefix sums of the per-expert row counts and 64-row tiles, in one block of kScanThreads
// over E in chunks (integers: exact in any order). A single-thread loop took 42 µs at E = 256 and
// 89 µs at E = 512 on the H200 (ncu), per MoE layer: most of a decode step's routing time.
constexpr int kScanThreads = 1024;
__global__ void __launch_bounds__(kScanThreads) k_scan(int32_t* counts, int E, int32_t* offsets, int32_t* tile_off) {
  __shared__ int32_t so[kScanThreads], stl[kScanThreads];
  __shared__ int32_t carry_o, carry_t;
  const int tid = threadIdx.x;
  if (tid == 0) carry_o = carry_t = 0;
  __syncthreads();
  for (int base = 0; base < E; base += kScanThreads) {
    const int e = base + tid;
    const int32_t c = e < E ? counts[e] : 0, tl = (c + 63) / 64;
    so[tid] = c;
    stl[tid] = tl;
    __syncthreads();
    for (int off = 1; off < kScanThreads; off <<= 1) {  // inclusive scan (Hillis-Steele)
      const int32_t a = tid >= off ? so[tid - off] : 0, b = tid >= off ? stl[tid - off] : 0;
      __syncthreads();
      so[tid] += a;
      stl[tid] += b;
      __syncthreads();
    }
    if (e < E) {
      offsets[e] = carry_o + so[tid] - c;
      tile_off[e] = carry_t + stl[tid] - tl;
      counts[e] = 0;  // becomes the scatter cursor
    }
    __syncthreads();
    if (tid == kScanThreads - 1) carry_o += so[tid], carry_t += stl[tid];
    __syncthreads();
  }
  if (tid == 0) offsets[E] = carry_o, tile_off[E] = carry_t;
}
__global__ void k_scatter(const int32_t* idx, int64_t n, const int32_t* offsets, int32_t* cursor, int32_t* perm,
                          int32_t* pos_of) {
  for (int64_t a = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; a < n; a += int64_t(gridDim.x) * blockDim.x) {
    const int e = idx[a];
    const int32_t pos = offsets[e] + atomicAdd(&cursor[e], 1);
    perm[pos] = int32_t(a);
    pos_of[a] = pos;
  }
}
__global__ void k_moe_local_experts(const int32_t* idx, const float* w, int64_t n, int e0, int El, int32_t* idx_l,
                                    float* w_l) {
  for (int64_t a = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; a < n; a += int64_t(gridDim.x) * blockDim.x) {
    const int e = idx[a] - e0;
    const bool mine = e >= 0 && e < El;
    idx_l[a] = mine ? e : El;
    w_l[a] = mine ? w[a] : 0.f;
  }
}
__global__ void k_gather_rows(const bf16* x, const int32_t* perm, int64_t n, int top_k, int64_t D, bf16* xs) {
  const int64_t total = n * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / D, d = i % D;
    xs[i] = x[int64_t(perm[r] / top_k) * D + d];
  }
}

// The same two as 16-byte vectors (D % 8 == 0, 16-byte aligned rows): one thread moves / sums 8
// columns, per element the same arithmetic in the same order as the scalar kernels (bitwise equal
// results). The scalar kernels ran at ~0.8 TB/s on the H200 (ncu: 2-byte accesses and a 64-bit
// division per element), 7-10 % of an 8-layer Kimi / Qwen prefill.
// One warp per row, kRowU 16-byte loads in flight per lane before any store. (The grid-stride form,
// one load a thread behind perm's load and a 64-bit division per element, moved ~2.2 TB/s:
// 0.27 ms a call at GLM-5.3-Flash's 65536 x 4096, T = 8192, H200, docs/perf/README.md.)
__global__ void __launch_bounds__(32 * kRowWarps) k_gather_rows8(const uint4* x, const int32_t* perm, int64_t n, int top_k,
                                                                 int64_t D8, uint4* xs) {
  const int64_t r = blockIdx.x * int64_t(kRowWarps) + (threadIdx.x >> 5);
  if (r >= n) return;
  uint4* dst = xs + r * D8;
  each_row16(x + int64_t(perm[r] / top_k) * D8, D8, threadIdx.x & 31, [&](int64_t d, const uint4& v) { dst[d] = v; });
}
__global__ void k_moe_combine8(const uint4* ys, const int32_t* pos_of, const float* w, int64_t T, int top_k,
                               int64_t D8, uint4* y) {
  const int64_t n = T * D8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D8, d = i - t * D8;
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j < top_k; ++j) {
      const float wj = w[t * top_k + j];
      const uint4 v = __ldg(ys + int64_t(pos_of[t * top_k + j]) * D8 + d);
      const bf16* e = reinterpret_cast<const bf16*>(&v);
#pragma unroll
      for (int c = 0; c < 8; ++c) acc[c] += wj * __bfloat162float(e[c]);
    }
    uint4 o;
    bf16* oe = reinterpret_cast<bf16*>(&o);
#pragma unroll
    for (int c = 0; c < 8; ++c) oe[c] = __float2bfloat16_rn(acc[c]);
    y[i] = o;
  }
}
__global__ void k_moe_combine(const bf16* ys, const int32_t* pos_of, const float* w, int64_t T, int top_k, int64_t D,
                              bf16* y) {
  const int64_t n = T * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    float acc = 0.f;
    for (int j = 0; j < top_k; ++j)
      acc += w[t * top_k + j] * __bfloat162float(ys[int64_t(pos_of[t * top_k + j]) * D + d]);
    y[i] = __float2bfloat16_rn(acc);
  }
}
__global__ void k_shared_add(const bf16* x, const float* gate, const bf16* sh, int64_t D, bf16* y) {
  const int64_t t = blockIdx.x;
  float g = 1.f;
  if (gate) {
    float d = 0.f;
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) d += __bfloat162float(x[t * D + i]) * gate[i];
    g = sigm(block_sum(d));
  }
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
    y[t * D + i] = __float2bfloat16_rn(__bfloat162float(y[t * D + i]) + g * __bfloat162float(sh[t * D + i]));
}
// The same, 8 elements a thread (D % 8 == 0, 16-byte aligned): 2.35x k_shared_add at T = 32768,
// D = 2048 (4.18 TB/s). Gate dot product summed per thread, a butterfly, then the warps ascending.
__global__ void __launch_bounds__(256) k_shared_add8(const bf16* __restrict__ x, const float* __restrict__ gate,
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
    d = warp_sum(d);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = d;
    __syncthreads();
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) tot += part[i];
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

// ---- DSA indexer pieces ----
__global__ void k_layer_norm(const void* x, Dt xdt, const float* w, const float* b, void* y, Dt ydt, int64_t D,
                             float eps) {
  const int64_t r = blockIdx.x;
  float sum = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) sum += ldv(x, xdt, r * D + d);
  const float mean = block_sum(sum) / float(D);
  float var = 0.f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    const float c = ldv(x, xdt, r * D + d) - mean;
    var += c * c;
  }
  const float inv = 1.f / sqrtf(block_sum(var) / float(D) + eps);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float n = (ldv(x, xdt, r * D + d) - mean) * inv;
    if (w) n *= w[d];
    if (b) n += b[d];
    stv(y, ydt, r * D + d, n);
  }
}
__global__ void k_scale(float* x, float a, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= a;
}
// One block per (query, 128-key tile); the query's [H, D] row in shared memory, a thread per key.
constexpr int kIdxTile = 128, kIdxMaxQ = 8192;
__global__ void __launch_bounds__(kIdxTile) k_indexer_scores_any(const bf16* q, const float* w, const bf16* k,
                                                                 int64_t pos0, int H, int D, float* scores,
                                                                 int64_t ld) {
  __shared__ float qs[kIdxMaxQ];
  __shared__ float ws[64];
  const int64_t t = blockIdx.y, s = int64_t(blockIdx.x) * kIdxTile + threadIdx.x, last = pos0 + t;
  if (int64_t(blockIdx.x) * kIdxTile > last) return;
  for (int i = threadIdx.x; i < H * D; i += blockDim.x) qs[i] = __bfloat162float(q[t * H * D + i]);
  for (int i = threadIdx.x; i < H; i += blockDim.x) ws[i] = w[t * H + i];
  __syncthreads();
  if (s > last) return;
  const bf16* kr = k + s * D;
  float acc = 0.f;
  for (int h = 0; h < H; ++h) {
    float d = 0.f;
    for (int i = 0; i < D; ++i) d += qs[h * D + i] * __bfloat162float(kr[i]);
    if (d > 0.f) acc += ws[h] * d;
  }
  scores[t * ld + s] = acc;
}

__global__ void k_kv_fp8_dequant(const uint8_t* codes, const float* scales, int64_t rows, int64_t n, bf16* y) {
  const int64_t tiles = (n + 127) / 128, total = rows * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(codes[i]), __NV_E4M3);
    y[i] = __float2bfloat16_rn(__half2float(__half(h)) * scales[r * tiles + c / 128]);
  }
}

// ---- LM head: one block per row ----
// Per row, one online pass (max, sum of exp(x - max), target logit): a thread's running max and
// sum, rescaled when the max grows, threads merged in a fixed order; exp in fp32 (x - max <= 0:
// expf within 2 ulp), summed in fp64. (It replaced a max kernel, a host round trip and a sum with
// an fp64 exp per logit: 0.278 vs 1.743 ms for Qwen3.5's 1081 x 248320 chunk on the H200,
// docs/perf/experiments_697349f.txt.) As the CPU's two loops: NaN never wins the max (fmaxf) and
// reaches the sum, a -inf logit adds 0, a row of only -inf has sum NaN (exp(-inf - -inf)).
constexpr int kLseThreads = 512;
// exp(v - m) of a logit, 0 for v = -inf also while the running max m is still -inf
__device__ __forceinline__ double lse_term(float v, float m) { return v == -INFINITY ? 0.0 : double(expf(v - m)); }
__global__ void __launch_bounds__(kLseThreads) k_lse_parts(const float* __restrict__ lg, int64_t n,
                                                           const int32_t* __restrict__ target, int64_t v0,
                                                           double* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const float* x = lg + r * n;
  float m = -INFINITY;
  double s = 0.0;
  if ((n & 3) == 0 && (reinterpret_cast<uintptr_t>(lg) & 15) == 0) {  // every row 16-byte aligned
    const float4* x4 = reinterpret_cast<const float4*>(x);
    for (int64_t j = threadIdx.x; j < n / 4; j += kLseThreads) {
      const float4 v = x4[j];
      const float vm = fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w));
      if (vm > m) {  // rescale the running sum to the new max (rare after the first loads)
        s *= double(expf(m - vm));  // m = -inf: s is 0, or NaN after a NaN logit, and stays so
        m = vm;
      }
      s += lse_term(v.x, m) + lse_term(v.y, m) + lse_term(v.z, m) + lse_term(v.w, m);
    }
  } else {
    for (int64_t j = threadIdx.x; j < n; j += kLseThreads) {
      const float v = x[j];
      if (v > m) {
        s *= double(expf(m - v));
        m = v;
      }
      s += lse_term(v, m);
    }
  }
  // merge the block's (m, s) pairs: within warps by butterfly, then thread 0 over the warps in order
  __shared__ float wm[kLseThreads / 32];
  __shared__ double wsum[kLseThreads / 32];
  for (int o = 16; o; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o);
    const double os = __shfl_xor_sync(0xffffffffu, s, o);
    const float nm = fmaxf(m, om);
    s = nm == -INFINITY ? s + os : s * double(expf(m - nm)) + os * double(expf(om - nm));
    m = nm;
  }
  if ((threadIdx.x & 31) == 0) {
    wm[threadIdx.x >> 5] = m;
    wsum[threadIdx.x >> 5] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int w = 0; w < kLseThreads / 32; ++w) M = fmaxf(M, wm[w]);
    double S = 0.0;
    for (int w = 0; w < kLseThreads / 32; ++w) S += wsum[w] * double(expf(wm[w] - M));  // M = -inf: NaN
    if (n == 0) S = 0.0;  // an empty shard, as the CPU's empty loop
    const int64_t t = target ? int64_t(target[r]) - v0 : -1;
    out[3 * r] = M;
    out[3 * r + 1] = S;
    out[3 * r + 2] = (t >= 0 && t < n) ? double(x[t]) : 0.0;
  }
}
__global__ void k_row_topk(const float* lg, int64_t n, int k, int32_t* ids, float* vals) {
  const int64_t r = blockIdx.x;
  const float* x = lg + r * n;
  __shared__ float sv[32];
  __shared__ int si[32];
  float lv = INFINITY;  // the last chosen (value, column): the next is the best strictly worse one
  int li = -1;
  for (int j = 0; j < k; ++j) {
    float bv = -INFINITY;
    int bi = 1 << 30;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      const float v = x[c];
      const bool worse = v < lv || (v == lv && int(c) > li);
      if (worse && better(v, int(c), bv, bi)) bv = v, bi = int(c);
    }
    for (int o = 16; o; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    const int lane = threadIdx.x & 31, wv = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sv[wv] = bv, si[wv] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int q = 1; q < int(blockDim.x >> 5); ++q)
        if (better(sv[q], si[q], sv[0], si[0])) sv[0] = sv[q], si[0] = si[q];
      ids[r * k + j] = si[0];
      vals[r * k + j] = sv[0];
    }
    __syncthreads();
    lv = sv[0];
    li = si[0];
  }
}

}  // namespace

void convert(const void* src, Dt sdt, void* dst, Dt ddt, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  k_convert<<<grid_for(n, 256), 256, 0, s>>>(src, sdt, dst, ddt, n);
  CUDA_CHECK_LAUNCH();
}
void split_bf16x3(const float* w, int64_t n, bf16* out, cudaStream_t s) {
  if (n <= 0) return;
  k_split_bf16x3<<<grid_for(n, 256), 256, 0, s>>>(w, n, out);
  CUDA_CHECK_LAUNCH();
}
void repeat_cols(const bf16* x, int64_t R, int64_t C, int k, bf16* out, cudaStream_t s) {
  if (R * C <= 0 || k <= 0) return;
  if (C % 8 == 0 && aligned16(x) && aligned16(out))
    k_repeat_cols<uint4><<<grid_for(R * C / 8, 256), 256, 0, s>>>(reinterpret_cast<const uint4*>(x), R, C / 8, k,
                                                                   reinterpret_cast<uint4*>(out));
  else
    k_repeat_cols<bf16><<<grid_for(R * C, 256), 256, 0, s>>>(x, R, C, k, out);
  CUDA_CHECK_LAUNCH();
}
void copy_many(const CopyDesc* descs, int n, uint64_t max_bytes, cudaStream_t s) {
  if (n <= 0 || max_bytes == 0) return;
  constexpr int kThreads = 256;
  // enough CTAs per copy to cover the largest at a word a thread, at most 32 (a copy of 2 MiB then
  // takes 16 words a thread); rows of the grid in chunks of 65535 copies
  const unsigned x = unsigned(std::min<uint64_t>((max_bytes / 16 + kThreads - 1) / kThreads + 1, 32));
  for (int at = 0; at < n; at += 65535) {
    const int m = std::min(n - at, 65535);
    k_copy_many<<<dim3(x, unsigned(m)), kThreads, 0, s>>>(descs + at);
    CUDA_CHECK_LAUNCH();
  }
}
void split_bf16x3_rows(const float* w, int64_t rows, int64_t D, bf16* out, cudaStream_t s) {
  if (rows * D <= 0) return;
  k_split_bf16x3_rows<<<grid_for(rows * D, 256), 256, 0, s>>>(w, rows, D, out);
  CUDA_CHECK_LAUNCH();
}
void dummy_mx4(uint8_t* packed, uint8_t* scales, const uint64_t* keys, int64_t E, int64_t R, int64_t C, DummyDist d,
               int64_t ld, int64_t r0, int64_t c0, cudaStream_t s) {
  if (E * R * C <= 0) return;
  k_dummy_mx4<<<grid_for(E * R * C / 32, 256), 256, 0, s>>>(packed, scales, keys, E, R, C, d, ld, r0, c0);
  CUDA_CHECK_LAUNCH();
}
void fill_dummy(void* y, Dt dt, int64_t R, int64_t C, uint64_t key, DummyDist d, int64_t ld, int64_t r0, int64_t c0,
                cudaStream_t s) {
  if (R * C <= 0) return;
  k_fill_dummy<<<grid_for(R * C, 256), 256, 0, s>>>(y, dt, R, C, key, d, ld, r0, c0);
  CUDA_CHECK_LAUNCH();
}
void set_i32(int32_t* dst, int n, SmallI32 v, cudaStream_t s) {
  DZ_CHECK(n >= 0 && n <= kSmallI32, "set_i32: ", n, " values (at most ", kSmallI32, ")");
  if (n == 0) return;
  k_set_i32<<<1, kSmallI32, 0, s>>>(dst, n, v);
  CUDA_CHECK_LAUNCH();
}
void iota_i32(int32_t* dst, int64_t n, int32_t start, cudaStream_t s) {
  DZ_CHECK(n >= 0 && int64_t(start) + n <= (int64_t(1) << 31), "iota_i32: ", n, " values from ", start);
  if (n == 0) return;
  k_iota_i32<<<grid_for(n, 256), 256, 0, s>>>(dst, n, start);
  CUDA_CHECK_LAUNCH();
}
void embed(const void* table, Dt tdt, const int32_t* ids, int64_t T, int64_t D, float* out, cudaStream_t s) {
  if (T * D <= 0) return;
  if (tdt == Dt::BF16 && D % 8 == 0 && aligned16(table) && aligned16(out)) {
    DZ_CHECK((T + kRowWarps - 1) / kRowWarps < (int64_t(1) << 31), "embed: ", T, " tokens");
    k_embed8<<<unsigned((T + kRowWarps - 1) / kRowWarps), 32 * kRowWarps, 0, s>>>(
        reinterpret_cast<const uint4*>(table), ids, T, D / 8, reinterpret_cast<float4*>(out));
  } else {
    k_embed<<<grid_for(T * D, 256), 256, 0, s>>>(table, tdt, ids, T, D, out);
  }
  CUDA_CHECK_LAUNCH();
}
void rmsnorm(const void* x, Dt xdt, const float* w, void* y, Dt ydt, int64_t rows, int64_t D, float eps, bool zc,
             cudaStream_t s) {
  if (rows <= 0) return;
  const int64_t blocks = (rows + kNormWarps - 1) / kNormWarps;
  DZ_CHECK(blocks < (int64_t(1) << 31), "rmsnorm: ", rows, " rows");
  const bool vec8 = D >= 1024 && D % 8 == 0 && aligned16(x) && aligned16(y) && (!w || aligned16(w));
  const bool done = with_type2(xdt, ydt, [&](auto* tx, auto* ty) {
    using TX = std::remove_pointer_t<decltype(tx)>;
    using TY = std::remove_pointer_t<decltype(ty)>;
    return with_rows8(D, {x, y, w}, [&](auto lpr) {
      constexpr int L = decltype(lpr)::value;
      const int64_t b8 = (rows + kNormWarps * (32 / L) - 1) / (kNormWarps * (32 / L));
      k_norm_rows8<L, TX, TX, TY><<<unsigned(b8), 32 * kNormWarps, 0, s>>>(
          static_cast<const TX*>(x), nullptr, w, static_cast<TY*>(y), rows, eps, zc, 0);
    });
  });
  if (done) {
    CUDA_CHECK_LAUNCH();
    return;
  }
  with_type(xdt, [&](auto* tx) {
    with_type(ydt, [&](auto* ty) {
      using TX = std::remove_pointer_t<decltype(tx)>;
      using TY = std::remove_pointer_t<decltype(ty)>;
      if (vec8)
        k_rmsnorm8<TX, TY><<<unsigned(blocks), 32 * kNormWarps, 0, s>>>(static_cast<const TX*>(x), w,
                                                                        static_cast<TY*>(y), rows, D, eps, zc);
      else
        k_rmsnorm<TX, TY><<<unsigned(blocks), 32 * kNormWarps, 0, s>>>(static_cast<const TX*>(x), w,
                                                                       static_cast<TY*>(y), rows, D, eps, zc);
    });
  });
  CUDA_CHECK_LAUNCH();
}
void gated_rmsnorm(const void* x, Dt xdt, const void* gate, Dt gdt, const float* w, void* y, Dt ydt, int64_t rows,
                   int64_t D, float eps, int act, cudaStream_t s) {
  if (rows <= 0) return;
  const int64_t blocks = (rows + kNormWarps - 1) / kNormWarps;
  DZ_CHECK(blocks < (int64_t(1) << 31), "gated_rmsnorm: ", rows, " rows");
  const bool done = with_type2(xdt, ydt, [&](auto* tx, auto* ty) {
    using TX = std::remove_pointer_t<decltype(tx)>;
    using TY = std::remove_pointer_t<decltype(ty)>;
    return with_type_r(gdt, [&](auto* tg) {
      using TG = std::remove_pointer_t<decltype(tg)>;
      return with_rows8(D, {x, gate, y, w}, [&](auto lpr) {
        constexpr int L = decltype(lpr)::value;
        const int64_t b8 = (rows + kNormWarps * (32 / L) - 1) / (kNormWarps * (32 / L));
        k_norm_rows8<L, TX, TG, TY><<<unsigned(b8), 32 * kNormWarps, 0, s>>>(
            static_cast<const TX*>(x), static_cast<const TG*>(gate), w, static_cast<TY*>(y), rows, eps, false, act);
      });
    });
  });
  if (done) {
    CUDA_CHECK_LAUNCH();
    return;
  }
  with_type(xdt, [&](auto* tx) {
    with_type(gdt, [&](auto* tg) {
      with_type(ydt, [&](auto* ty) {
        using TX = std::remove_pointer_t<decltype(tx)>;
        using TG = std::remove_pointer_t<decltype(tg)>;
        using TY = std::remove_pointer_t<decltype(ty)>;
        k_gated_rmsnorm<TX, TG, TY><<<unsigned(blocks), 32 * kNormWarps, 0, s>>>(
            static_cast<const TX*>(x), static_cast<const TG*>(gate), w, static_cast<TY*>(y), rows, D, eps, act);
      });
    });
  });
  CUDA_CHECK_LAUNCH();
}
void add(void* h, Dt hdt, const void* y, Dt ydt, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (n % 8 == 0 && aligned16(h) && aligned16(y)) {
    with_type(hdt, [&](auto* th) {
      with_type(ydt, [&](auto* ty) {
        using TH = std::remove_pointer_t<decltype(th)>;
        using TY = std::remove_pointer_t<decltype(ty)>;
        k_add8<TH, TY><<<grid_for(n / 8, 256), 256, 0, s>>>(static_cast<TH*>(h), static_cast<const TY*>(y), n / 8);
      });
    });
  } else {
    k_add<<<grid_for(n, 256), 256, 0, s>>>(h, hdt, y, ydt, n);
  }
  CUDA_CHECK_LAUNCH();
}
void mul_sigmoid(void* x, Dt xdt, const void* g, Dt gdt, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (n % 8 == 0 && aligned16(x) && aligned16(g)) {
    with_type2(xdt, gdt, [&](auto* tx, auto* tg) {
      using TX = std::remove_pointer_t<decltype(tx)>;
      using TG = std::remove_pointer_t<decltype(tg)>;
      k_mul_sigmoid8<TX, TG><<<grid_for(n / 8, 256), 256, 0, s>>>(static_cast<TX*>(x), static_cast<const TG*>(g), n / 8);
      return true;
    });
  } else {
    k_mul_sigmoid<<<grid_for(n, 256), 256, 0, s>>>(x, xdt, g, gdt, n);
  }
  CUDA_CHECK_LAUNCH();
}
void add_bias(void* y, Dt ydt, const float* bias, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows * cols <= 0) return;
  k_add_bias<<<grid_for(rows * cols, 256), 256, 0, s>>>(y, ydt, bias, rows, cols);
  CUDA_CHECK_LAUNCH();
}
void silu_mul(const bf16* g, const bf16* u, bf16* h, int64_t n, const GluAct& act, cudaStream_t s) {
  if (n <= 0) return;
  int64_t done = 0;
  if (aligned16(g) && aligned16(u) && aligned16(h) && n >= 8) {
    const int64_t n8 = n / 8;
    k_silu_mul8<<<grid_for(n8, 256), 256, 0, s>>>(reinterpret_cast<const uint4*>(g), reinterpret_cast<const uint4*>(u),
                                                  reinterpret_cast<uint4*>(h), n8, act);
    CUDA_CHECK_LAUNCH();
    done = n8 * 8;
  }
  if (done < n) {
    k_silu_mul<<<grid_for(n - done, 256), 256, 0, s>>>(g + done, u + done, h + done, n - done, act);
    CUDA_CHECK_LAUNCH();
  }
}
void rope(void* x, Dt dt, int64_t T, int64_t H, int64_t hs, int64_t offset, int64_t pos0, const RopeParams& p,
          cudaStream_t s) {
  DZ_CHECK(p.half > 0 && p.half <= 256, "rope: ", p.half, " rotated pairs (at most 256)");
  if (T * H <= 0) return;
  k_rope<<<grid_for(T * H * p.half, 256), 256, 0, s>>>(x, dt, T, H, hs, offset, pos0, nullptr, 0, nullptr, p);
  CUDA_CHECK_LAUNCH();
}
void rope_varlen(void* x, Dt dt, int64_t T, int64_t H, int64_t hs, int64_t offset, const int32_t* cu, int n_seq,
                 const RopeParams& p, cudaStream_t s) {
  DZ_CHECK(p.half > 0 && p.half <= 256, "rope: ", p.half, " rotated pairs (at most 256)");
  DZ_CHECK(cu && n_seq >= 1 && T < (int64_t(1) << 31), "rope_varlen: ", n_seq, " sequences of ", T, " rows");
  if (T * H <= 0) return;
  k_rope<<<grid_for(T * H * p.half, 256), 256, 0, s>>>(x, dt, T, H, hs, offset, 0, cu, n_seq, nullptr, p);
  CUDA_CHECK_LAUNCH();
}
void rope_rows(void* x, Dt dt, int64_t T, int64_t H, int64_t hs, int64_t offset, const int32_t* pos,
               const RopeParams& p, cudaStream_t s) {
  DZ_CHECK(p.half > 0 && p.half <= 256, "rope: ", p.half, " rotated pairs (at most 256)");
  DZ_CHECK(pos && T < (int64_t(1) << 31), "rope_rows: ", T, " rows");
  if (T * H <= 0) return;
  k_rope<<<grid_for(T * H * p.half, 256), 256, 0, s>>>(x, dt, T, H, hs, offset, 0, nullptr, 0, pos, p);
  CUDA_CHECK_LAUNCH();
}
void attention(const bf16* q, const bf16* k, const bf16* v, bf16* out, int64_t T, int64_t pos0, int64_t S, int Hq,
               int Hkv, int Dk, int Dv, float scale, const int32_t* sel, int64_t n_sel, cudaStream_t s) {
  DZ_CHECK(Dk <= 32 * kMaxDPerLane && Dv <= 32 * kMaxDPerLane, "attention: head dims ", Dk, "/", Dv, " (at most ",
           32 * kMaxDPerLane, ")");
  DZ_CHECK(Hq % Hkv == 0 && S >= pos0 + T, "attention: heads ", Hq, "/", Hkv, ", S ", S, " for pos0 ", pos0, " + ", T);
  if (T <= 0) return;
  const int64_t warps = T * Hq;
  k_attention<<<unsigned((warps + 3) / 4), 128, 0, s>>>(q, k, v, out, T, pos0, Hq, Hkv, Dk, Dv, scale, sel, n_sel);
  CUDA_CHECK_LAUNCH();
}
void attn_res_mix(const float* blocks, int64_t n, const float* partial, const float* q, int64_t T, int64_t D,
                  float eps, float* out, cudaStream_t s) {
  DZ_CHECK(n + 1 <= kMaxDepth, "attn_res_mix: ", n + 1, " values (at most ", kMaxDepth, ")");
  if (T <= 0) return;
  k_attn_res_mix<<<unsigned(T), 256, 0, s>>>(blocks, n, partial, q, T, D, eps, out);
  CUDA_CHECK_LAUNCH();
}
void moe_select(const float* logits, const float* bias, int64_t T, const RouteParams& p, int32_t* idx, float* w,
                int32_t* bad, cudaStream_t s, const int32_t* fixed) {
  DZ_CHECK(p.top_k <= 64 && p.n_group <= 64 && p.E % p.n_group == 0, "moe_select: top_k ", p.top_k, ", groups ",
           p.n_group, " of ", p.E, " experts");
  if (T <= 0) return;
  const size_t smem = size_t(2 * p.E + p.n_group) * sizeof(float);
  k_moe_select<<<unsigned(T), 32, smem, s>>>(logits, bias, T, p, idx, w, bad, fixed);
  CUDA_CHECK_LAUNCH();
}
void moe_dispatch(const int32_t* idx, int64_t T, int top_k, int E, int32_t* counts, int32_t* offsets,
                  int32_t* tile_off, int32_t* perm, int32_t* pos_of, cudaStream_t s) {
  const int64_t n = T * top_k;
  CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * size_t(E), s));
  if (n > 0) {
    k_count<<<grid_for(n, 256), 256, 0, s>>>(idx, n, counts);
    CUDA_CHECK_LAUNCH();
  }
  k_scan<<<1, kScanThreads, 0, s>>>(counts, E, offsets, tile_off);
  CUDA_CHECK_LAUNCH();
  if (n > 0) {
    k_scatter<<<grid_for(n, 256), 256, 0, s>>>(idx, n, offsets, counts, perm, pos_of);
    CUDA_CHECK_LAUNCH();
  }
}
void moe_local_experts(const int32_t* idx, const float* w, int64_t n, int e0, int El, int32_t* idx_l, float* w_l,
                       cudaStream_t s) {
  if (n <= 0) return;
  k_moe_local_experts<<<grid_for(n, 256), 256, 0, s>>>(idx, w, n, e0, El, idx_l, w_l);
  CUDA_CHECK_LAUNCH();
}
// Rows of D bf16 can move as 16-byte vectors: D % 8 == 0 and both bases 16-byte aligned.
static bool vec8(const void* a, const void* b, int64_t D) {
  return D % 8 == 0 && aligned16(a) && aligned16(b);
}
void gather_rows(const bf16* x, const int32_t* perm, int64_t n, int top_k, int64_t D, bf16* xs, cudaStream_t s) {
  if (n * D <= 0) return;
  if (vec8(x, xs, D)) {
    DZ_CHECK((n + kRowWarps - 1) / kRowWarps < (int64_t(1) << 31), "gather_rows: ", n, " rows");
    k_gather_rows8<<<unsigned((n + kRowWarps - 1) / kRowWarps), 32 * kRowWarps, 0, s>>>(
        reinterpret_cast<const uint4*>(x), perm, n, top_k, D / 8, reinterpret_cast<uint4*>(xs));
  } else {
    k_gather_rows<<<grid_for(n * D, 256), 256, 0, s>>>(x, perm, n, top_k, D, xs);
  }
  CUDA_CHECK_LAUNCH();
}
void moe_combine(const bf16* ys, const int32_t* pos_of, const float* w, int64_t T, int top_k, int64_t D, bf16* y,
                 cudaStream_t s) {
  if (T * D <= 0) return;
  if (vec8(ys, y, D)) {
    k_moe_combine8<<<grid_for(T * (D / 8), 256), 256, 0, s>>>(reinterpret_cast<const uint4*>(ys), pos_of, w, T, top_k,
                                                             D / 8, reinterpret_cast<uint4*>(y));
  } else {
    k_moe_combine<<<grid_for(T * D, 256), 256, 0, s>>>(ys, pos_of, w, T, top_k, D, y);
  }
  CUDA_CHECK_LAUNCH();
}
void shared_expert_add(const bf16* x, const float* gate, const bf16* sh, int64_t T, int64_t D, bf16* y,
                       cudaStream_t s) {
  if (T <= 0) return;
  if (D % 8 == 0 && aligned16(x) && aligned16(sh) && aligned16(y) && (!gate || aligned16(gate)))
    k_shared_add8<<<unsigned(T), 256, 0, s>>>(x, gate, sh, D, y);
  else
    k_shared_add<<<unsigned(T), 256, 0, s>>>(x, gate, sh, D, y);
  CUDA_CHECK_LAUNCH();
}
void layer_norm(const void* x, Dt xdt, const float* w, const float* b, void* y, Dt ydt, int64_t rows, int64_t D,
                float eps, cudaStream_t s) {
  if (rows <= 0) return;
  k_layer_norm<<<unsigned(rows), D >= 256 ? 256 : 64, 0, s>>>(x, xdt, w, b, y, ydt, D, eps);
  CUDA_CHECK_LAUNCH();
}
void scale(float* x, float a, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  k_scale<<<grid_for(n, 256), 256, 0, s>>>(x, a, n);
  CUDA_CHECK_LAUNCH();
}
void indexer_scores_any(const bf16* q, const float* w, const bf16* k, int64_t T, int64_t pos0, int H, int D,
                        float* scores, int64_t ld, cudaStream_t s) {
  DZ_CHECK(H * D <= kIdxMaxQ && H <= 64, "indexer_scores_any: ", H, " heads x ", D, " (H*D <= ", kIdxMaxQ,
           ", H <= 64)");
  if (T <= 0) return;
  DZ_CHECK(T < 65536, "indexer_scores_any: ", T, " query rows per call (at most 65535)");
  dim3 grid(unsigned((pos0 + T + kIdxTile - 1) / kIdxTile), unsigned(T));
  k_indexer_scores_any<<<grid, kIdxTile, 0, s>>>(q, w, k, pos0, H, D, scores, ld);
  CUDA_CHECK_LAUNCH();
}
void kv_fp8_dequantize_bf16(const uint8_t* codes, const float* scales, int64_t rows, int64_t n, bf16* y,
                            cudaStream_t s) {
  if (rows * n <= 0) return;
  k_kv_fp8_dequant<<<grid_for(rows * n, 256), 256, 0, s>>>(codes, scales, rows, n, y);
  CUDA_CHECK_LAUNCH();
}
void lse_parts(const float* logits, int64_t m, int64_t n, const int32_t* target, int64_t v0, double* out,
               cudaStream_t s) {
  if (m <= 0) return;
  k_lse_parts<<<unsigned(m), kLseThreads, 0, s>>>(logits, n, target, v0, out);
  CUDA_CHECK_LAUNCH();
}
void row_topk(const float* logits, int64_t m, int64_t n, int k, int32_t* ids, float* vals, cudaStream_t s) {
  if (m <= 0 || k <= 0) return;
  k_row_topk<<<unsigned(m), 256, 0, s>>>(logits, n, k, ids, vals);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda
