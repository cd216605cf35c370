// Grouped MoE expert products for few rows (a decode step), and the same for one dense weight (a
// linear layer at a decode step), see moe_gemm.cuh.
//
// The tensor-core kernels multiply 128-row tiles: with a handful of rows (one token's top-k
// experts) most of each tile is padding, and the column tiles of 256 leave half the SMs idle
// (ncu at 6c96146: ~1.3 TB/s on the expert weights). Here a block streams a 64-column slab of
// one expert's weights once and multiplies it with every row that expert received:
//   grid (n, ceil(N / 64)): block (i, cb) works only if row i is its expert's first row (one
//   block per non-empty expert and column slab, the others return at once); 8 warps x 8 columns;
//   lane l reads the 16-byte chunks l, l + 32, .. of each column's weight row (coalesced 512 B per
//   warp step) and of each row of x, keeps fp32 partial dots, and the warp sums them with a fixed
//   butterfly. Rows go in chunks of kRows (the weights are re-read per chunk, from L2).
// Deterministic: each output is one fixed-order fp32 reduction (lane-strided chunks ascending,
// then the butterfly), whatever the rest of the batch. Not bitwise equal to the tensor-core
// kernels (another order): the backend picks by the number of rows only.
#include <cuda_bf16.h>

#include <cstdint>

#include "common.cuh"
#include "moe_gemm.cuh"

namespace dz::cuda {

namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 256;
constexpr int kRows = 4;  // rows per chunk
// Columns per warp: 8 for the experts (the grid has a block per expert and slab already); 2 for a
// dense layer (no expert axis: 16-column slabs give N / 16 blocks, e.g. 144 at N = 2304).
constexpr int kExpertCols = 8, kDenseCols = 2;

__device__ __forceinline__ void store_out(bf16* y, int64_t i, float v) { y[i] = __float2bfloat16(v); }
__device__ __forceinline__ void store_out(float* y, int64_t i, float v) { y[i] = v; }

__device__ __forceinline__ float silu_f(float g) { return __fdividef(g, 1.f + __expf(-g)); }

__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&b);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 u = __bfloat1622float2(x[i]), v = __bfloat1622float2(y[i]);
    s = fmaf(u.x, v.x, s);
    s = fmaf(u.y, v.y, s);
  }
  return s;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

// The expert of sorted row i (largest e with offsets[e] <= i) and whether i is its first row.
__device__ __forceinline__ bool first_row_of(const int32_t* offsets, int E, int i, int& e) {
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (offsets[mid] <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  e = lo;
  return offsets[lo] == i && offsets[lo + 1] > i;
}

// NW weight matrices (1: plain, 2: gate and up) per output; VEC: K % 8 == 0 and 16-byte aligned
// rows (chunks of 8), else single elements; kCols columns per warp. offsets nullptr: one dense
// weight [N, K] for all n rows (grid.x = 1).
template <int NW, bool VEC, int kCols, typename OutT>
__global__ void __launch_bounds__(kThreads) k_moe_gemv(const bf16* __restrict__ xs, const bf16* __restrict__ w0,
                                                       const bf16* __restrict__ w1, const int32_t* __restrict__ offsets,
                                                       int E, int n, int N, int K, OutT* __restrict__ y) {
  constexpr int kBlockCols = 8 * kCols;
  int e = 0, r0 = 0, R = n;
  if (offsets) {
    if (!first_row_of(offsets, E, int(blockIdx.x), e)) return;
    r0 = offsets[e];
    R = offsets[e + 1] - r0;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c0 = int(blockIdx.y) * kBlockCols + warp * kCols;
  if (c0 >= N) return;
  const bf16* W[2] = {w0 + (int64_t(e) * N) * K, (NW == 2 ? w1 : w0) + (int64_t(e) * N) * K};
  for (int rc = 0; rc < R; rc += kRows) {
    float acc[NW][kRows][kCols];
#pragma unroll
    for (int m = 0; m < NW; ++m)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int j = 0; j < kCols; ++j) acc[m][r][j] = 0.f;
    if (VEC) {
      const int K8 = K / 8;
      // Dense (2 columns per warp): 4 steps unrolled, so several 16-byte loads are in flight per
      // lane; the expert kernels have 8 columns' loads per step already.
#pragma unroll(kCols <= 2 ? 4 : 1)
      for (int k8 = lane; k8 < K8; k8 += 32) {
        uint4 xv[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          xv[r] = rc + r < R ? __ldg(reinterpret_cast<const uint4*>(xs + int64_t(r0 + rc + r) * K) + k8) : uint4{};
#pragma unroll
        for (int m = 0; m < NW; ++m)
#pragma unroll
          for (int j = 0; j < kCols; ++j) {
            if (c0 + j >= N) continue;
            const uint4 wv = __ldg(reinterpret_cast<const uint4*>(W[m] + int64_t(c0 + j) * K) + k8);
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[m][r][j] += dot8(xv[r], wv);
          }
      }
    } else {
      for (int k = lane; k < K; k += 32) {
        float xv[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          xv[r] = rc + r < R ? __bfloat162float(xs[int64_t(r0 + rc + r) * K + k]) : 0.f;
#pragma unroll
        for (int m = 0; m < NW; ++m)
#pragma unroll
          for (int j = 0; j < kCols; ++j) {
            if (c0 + j >= N) continue;
            const float wv = __bfloat162float(W[m][int64_t(c0 + j) * K + k]);
#pragma unroll
            for (int r = 0; r < kRows; ++r) acc[m][r][j] = fmaf(xv[r], wv, acc[m][r][j]);
          }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const float g = warp_sum(acc[0][r][j]);
        const float u = NW == 2 ? warp_sum(acc[NW - 1][r][j]) : 0.f;
        if (lane == j && rc + r < R && c0 + j < N)
          store_out(y, int64_t(r0 + rc + r) * N + c0 + j, NW == 2 ? silu_f(g) * u : g);
      }
  }
}

template <int NW, int kCols, typename OutT>
void launch(const bf16* xs, const bf16* w0, const bf16* w1, const int32_t* offsets, int E, int n, int64_t N, int64_t K,
            OutT* y, cudaStream_t s) {
  DZ_CHECK(n >= 0 && n <= kMoeGemvMaxRows && E >= 1 && N >= 1 && K >= 1 && N < (int64_t(1) << 31) &&
               K < (int64_t(1) << 31),
           "gemv: n ", n, " (at most ", kMoeGemvMaxRows, "), E ", E, ", N ", N, ", K ", K);
  if (n == 0) return;
  constexpr int kBlockCols = 8 * kCols;
  const dim3 grid(offsets ? unsigned(n) : 1u, unsigned((N + kBlockCols - 1) / kBlockCols));
  const bool vec = K % 8 == 0 && aligned16(xs) && aligned16(w0) && aligned16(w1);
  if (vec)
    k_moe_gemv<NW, true, kCols, OutT><<<grid, kThreads, 0, s>>>(xs, w0, w1, offsets, E, n, int(N), int(K), y);
  else
    k_moe_gemv<NW, false, kCols, OutT><<<grid, kThreads, 0, s>>>(xs, w0, w1, offsets, E, n, int(N), int(K), y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void grouped_gemv(const bf16* xs, const bf16* W, const int32_t* offsets, int E, int n, int64_t N, int64_t K, bf16* y,
                  cudaStream_t s) {
  DZ_CHECK(offsets, "grouped_gemv: no offsets");
  launch<1, kExpertCols>(xs, W, W, offsets, E, n, N, K, y, s);
}

void grouped_gemv_swiglu(const bf16* xs, const bf16* Wg, const bf16* Wu, const int32_t* offsets, int E, int n,
                         int64_t N, int64_t K, bf16* h, cudaStream_t s) {
  DZ_CHECK(offsets, "grouped_gemv_swiglu: no offsets");
  launch<2, kExpertCols>(xs, Wg, Wu, offsets, E, n, N, K, h, s);
}

void gemv_rows(const bf16* x, const bf16* W, int T, int64_t N, int64_t K, void* y, bool y_f32, cudaStream_t s) {
  if (y_f32)
    launch<1, kDenseCols>(x, W, W, nullptr, 1, T, N, K, static_cast<float*>(y), s);
  else
    launch<1, kDenseCols>(x, W, W, nullptr, 1, T, N, K, static_cast<bf16*>(y), s);
}

}  // namespace dz::cuda
