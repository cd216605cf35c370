// Experiment (issue 11): mHC's hc_pre in three kernels instead of a cuBLAS fp32 GEMM + k_hc_pre.
// At GLM-5.3-Flash's T = 8192 (N = 4 streams of D = 4096: 64 KB of fp32 streams a token) each of the
// 9 hc_pre calls of a 4-layer forward costs a cuBLAS SIMT GEMM x·fnᵀ (N·D = 16384 by C = 24 outputs:
// 0.27 ms at ~24 TFLOP/s, 41 % of DRAM) and k_hc_pre (0.27 ms at ~50 % of DRAM: one block per
// token holds the token's 64 KB in registers while warp 0 runs 20 Sinkhorn iterations, so two or
// three tokens per multiprocessor are in flight). ncu at fb08723: 4.9 ms of the 64.7 ms forward.
// Here:
//   k_hc_proj     m = x·fnᵀ on tensor cores in 3xTF32 (each fp32 operand split into a TF32 head and
//                 a TF32 remainder; a_lo b_hi + a_hi b_lo + a_hi b_hi, fp32 accumulation: ~fp32
//                 products, error ~2^-22 relative a product), and ss = Σ x² beside it. One warp:
//                 16 tokens x all C outputs over one eighth of the N·D columns; the fragments come
//                 straight from global memory (a lane's 16-byte load of columns 4t .. 4t + 3 feeds two
//                 m16n8k8 products, the k order permuted alike in A and B); the 8 slices are summed
//                 in a fixed order in shared memory. Reads x once.
//   k_hc_coeff    one warp a token: r = rsqrt(ss / (N·D) + eps), the coefficients and Sinkhorn
//                 (production's hc_coeffs_warp, in the CPU reference's summation order); all tokens at once,
//                 so the Sinkhorn latency no longer holds the streams.
//   k_hc_collapse in = Σ_n pre[n] x[n], streaming x a second time.
// Floor at T = 8192: two reads of 537 MB + 134 MB written, ~0.26 ms at 4 TB/s (production: 0.54 ms).
// Only K = N·D % 16 == 0 with 16-byte aligned rows (the harness checks the rest stays production's).
//   bash kernels/dev/hyper/run.sh
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common.cuh"
#include "hyper.cuh"
#include "hyper_coeffs.cuh"

namespace dz::cuda::dev {

namespace {

constexpr int kSlices = 8;     // K slices (warps) per 16-token group
constexpr int kTokGroups = 2;  // 16-token groups per block
constexpr int kProjThreads = 32 * kSlices * kTokGroups;

__device__ __forceinline__ uint32_t tf32(float v) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
  return r;
}
__device__ __forceinline__ void split(float v, uint32_t& hi, uint32_t& lo) {
  hi = tf32(v);
  lo = tf32(v - __uint_as_float(hi));
}
// d += a b, m16n8k8 TF32 (row-major A, column-major B)
__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ float4 ld4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

// m [T, C] = x [T, K] · fn [C, K]ᵀ (unscaled), ss [T] = Σ_k x². NT n-tiles of 8 outputs (C <= 8 NT).
// Lane (g = lane / 4, t = lane % 4) of a warp loads columns 4t .. 4t + 3 of a 16-column block of
// rows g and g + 8 (x) and of rows 8 j + g (fn): product 1 takes columns 4t, 4t + 1 as the
// fragments' k = t, t + 4, product 2 columns 4t + 2, 4t + 3.
template <int NT>
__global__ void __launch_bounds__(kProjThreads) k_hc_proj(const float* x, const float* fn, int64_t T, int64_t K, int C,
                                                          float* m, float* ss) {
  extern __shared__ float red[];  // [kTokGroups][kSlices][16][8 NT + 1]: partial m, then ss
  constexpr int RW = 8 * NT + 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int slice = warp % kSlices, tg = warp / kSlices;
  const int64_t tok0 = (int64_t(blockIdx.x) * kTokGroups + tg) * 16;
  const int64_t nkb = K / 16, kb0 = nkb * slice / kSlices, kb1 = nkb * (slice + 1) / kSlices;
  const bool v0 = tok0 + g < T, v1 = tok0 + g + 8 < T;
  const float* x0 = x + (v0 ? tok0 + g : 0) * K + 4 * t;
  const float* x1 = x + (v1 ? tok0 + g + 8 : 0) * K + 4 * t;
  const float* f[NT];
  bool fv[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    fv[j] = 8 * j + g < C;
    f[j] = fn + (fv[j] ? 8 * j + g : 0) * K + 4 * t;
  }
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float s0 = 0.f, s1 = 0.f;
  const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
  // one k-block of loads ahead
  float4 a = z, b = z, fb[NT];
  auto load = [&](int64_t kb) {
    const int64_t o = kb * 16;
    a = v0 ? ld4(x0 + o) : z;
    b = v1 ? ld4(x1 + o) : z;
#pragma unroll
    for (int j = 0; j < NT; ++j) fb[j] = fv[j] ? ld4(f[j] + o) : z;
  };
  if (kb0 < kb1) load(kb0);
  for (int64_t kb = kb0; kb < kb1; ++kb) {
    const float4 ca = a, cb = b;
    float4 cf[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) cf[j] = fb[j];
    if (kb + 1 < kb1) load(kb + 1);
    s0 = fmaf(ca.x, ca.x, s0), s0 = fmaf(ca.y, ca.y, s0), s0 = fmaf(ca.z, ca.z, s0), s0 = fmaf(ca.w, ca.w, s0);
    s1 = fmaf(cb.x, cb.x, s1), s1 = fmaf(cb.y, cb.y, s1), s1 = fmaf(cb.z, cb.z, s1), s1 = fmaf(cb.w, cb.w, s1);
    uint32_t ah[4], al[4], bh[4], bl[4];
    split(ca.x, ah[0], al[0]), split(ca.y, ah[1], al[1]), split(ca.z, ah[2], al[2]), split(ca.w, ah[3], al[3]);
    split(cb.x, bh[0], bl[0]), split(cb.y, bh[1], bl[1]), split(cb.z, bh[2], bl[2]), split(cb.w, bh[3], bl[3]);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      uint32_t fh[4], fl[4];
      split(cf[j].x, fh[0], fl[0]), split(cf[j].y, fh[1], fl[1]), split(cf[j].z, fh[2], fl[2]), split(cf[j].w, fh[3], fl[3]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // columns 4t + 2h, 4t + 2h + 1
        const int p = 2 * h, q = 2 * h + 1;
        mma_tf32(acc[j], al[p], bl[p], al[q], bl[q], fh[p], fh[q]);
        mma_tf32(acc[j], ah[p], bh[p], ah[q], bh[q], fl[p], fl[q]);
        mma_tf32(acc[j], ah[p], bh[p], ah[q], bh[q], fh[p], fh[q]);
      }
    }
  }
  // the quad's ss partials in a fixed order
  s0 += __shfl_xor_sync(0xffffffffu, s0, 1), s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
  s0 += __shfl_xor_sync(0xffffffffu, s0, 2), s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
  float* rw = red + (size_t(tg) * kSlices + slice) * 16 * RW;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int c = 8 * j + 2 * t;
    rw[g * RW + c] = acc[j][0], rw[g * RW + c + 1] = acc[j][1];
    rw[(g + 8) * RW + c] = acc[j][2], rw[(g + 8) * RW + c + 1] = acc[j][3];
  }
  if (t == 0) rw[g * RW + RW - 1] = s0, rw[(g + 8) * RW + RW - 1] = s1;
  __syncthreads();
  // slices summed in order: (token group, row, column) per thread
  for (int i = threadIdx.x; i < kTokGroups * 16 * (C + 1); i += kProjThreads) {
    const int c = i % (C + 1), r = (i / (C + 1)) % 16, tgi = i / ((C + 1) * 16);
    const int64_t tok = (int64_t(blockIdx.x) * kTokGroups + tgi) * 16 + r;
    if (tok >= T) continue;
    const int col = c == C ? RW - 1 : c;
    float s = 0.f;
    for (int sl = 0; sl < kSlices; ++sl) s += red[((size_t(tgi) * kSlices + sl) * 16 + r) * RW + col];
    if (c == C)
      ss[tok] = s;
    else
      m[tok * C + c] = s;
  }
}

// One warp a token: the coefficients by production's warp code (hyper_coeffs.cuh), r from ss.
template <int N>
__global__ void __launch_bounds__(256) k_hc_coeff(const float* m, const float* ssum, const float* base,
                                                  const float* scale, HcKernelParams p, int64_t T, int64_t D,
                                                  float* coeff) {
  constexpr int C = (2 + N) * N;
  __shared__ float cfs[8][(2 + kMaxN) * kMaxN];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t tk = int64_t(blockIdx.x) * 8 + w;
  if (tk >= T) return;
  const float r = rsqrtf(ssum[tk] / float(N * D) + p.eps_norm);
  hc_coeffs_warp<N>(m + tk * C, r, base, scale, p, lane, cfs[w], coeff + tk * C);
}

// in [T, D] = Σ_n pre[n] x[t, n, :], one block a token, 16-byte chunks (n ascending, as the CPU).
template <int N>
__global__ void __launch_bounds__(256) k_hc_collapse(const float* x, const float* coeff, int64_t D, float* in) {
  constexpr int C = (2 + N) * N;
  const int64_t t = blockIdx.x, nch = D / 4;
  float pre[N];
#pragma unroll
  for (int n = 0; n < N; ++n) pre[n] = coeff[t * C + n];
  const float* xt = x + t * N * D;
  for (int64_t c = threadIdx.x; c < nch; c += 256) {
    float4 v[N];
#pragma unroll
    for (int n = 0; n < N; ++n) v[n] = ld4(xt + n * D + 4 * c);
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int n = 0; n < N; ++n) {
      o.x += pre[n] * v[n].x, o.y += pre[n] * v[n].y, o.z += pre[n] * v[n].z, o.w += pre[n] * v[n].w;
    }
    *reinterpret_cast<float4*>(in + t * D + 4 * c) = o;
  }
}

}  // namespace

bool hc_pre_tc_supported(int N, int64_t D, const void* x, const void* fn, const void* in) {
  return N >= 1 && N <= kMaxN && D % 4 == 0 && (int64_t(N) * D) % 16 == 0 && aligned16(x) && aligned16(fn) && aligned16(in);
}

// work: [T, C] + [T] floats (m, ss).
void hc_pre_tc(const float* x, const float* fn, const float* base, const float* scale, const HcKernelParams& p,
               int64_t T, int64_t D, float* coeff, float* in, float* work, cudaStream_t s) {
  if (T <= 0) return;
  DZ_CHECK(hc_pre_tc_supported(p.N, D, x, fn, in), "hc_pre_tc: N ", p.N, ", D ", D, " unsupported");
  const int N = p.N, C = (2 + N) * N;
  const int64_t K = int64_t(N) * D;
  float* m = work;
  float* ss = work + T * C;
  with_streams(N, [&](auto nn) {
    constexpr int NS = decltype(nn)::value;
    constexpr int NT = ((2 + NS) * NS + 7) / 8;
    const size_t smem = sizeof(float) * kTokGroups * kSlices * 16 * (8 * NT + 1);
    CUDA_CHECK(cudaFuncSetAttribute(k_hc_proj<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    const unsigned blocks = unsigned((T + 16 * kTokGroups - 1) / (16 * kTokGroups));
    k_hc_proj<NT><<<blocks, kProjThreads, smem, s>>>(x, fn, T, K, C, m, ss);
    CUDA_CHECK_LAUNCH();
    k_hc_coeff<NS><<<unsigned((T + 7) / 8), 256, 0, s>>>(m, ss, base, scale, p, T, D, coeff);
    CUDA_CHECK_LAUNCH();
    k_hc_collapse<NS><<<unsigned(T), 256, 0, s>>>(x, coeff, D, in);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dz::cuda::dev
