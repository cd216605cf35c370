// FP8 quantization kernels; rules in lib/core/fp8.hpp, device helpers in quant_device.cuh.
#include "common.cuh"
#include "quant.cuh"
#include "quant_device.cuh"

namespace dz::cuda {

namespace {

constexpr int kWarps = 8;  // warps per block; one warp per group

// One warp per 32-element group: groups are numbered row-major over [rows, G].
template <typename T>
__global__ void mxfp8_kernel(const T* __restrict__ x, int64_t rows, int64_t n, uint8_t* __restrict__ codes,
                             uint8_t* __restrict__ scales) {
  const int64_t G = (n + 31) / 32;
  const int64_t grp = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (grp >= rows * G) return;  // whole warp leaves together
  const int lane = threadIdx.x & 31;
  const int64_t row = grp / G, g = grp % G;
  const int64_t col = g * 32 + lane;
  const bool in = col < n;
  const float v = in ? dev::to_f32(x[row * n + col]) : 0.f;
  uint8_t s;
  const uint8_t c = dev::warp_mx_quant(v, in, &s);
  if (in) codes[row * n + col] = c;
  if (lane == 0) scales[grp] = s;
}

// One warp per per-tile FP8 tile (the KV cache's rule). kPadT: the activations of an FP8
// block-scaled GEMM, scales written transposed ([G][ld], rows contiguous: the layout cuBLASLt's
// VEC128 mode reads) and rows rows..ld-1 zero; otherwise scales [rows][G] and ld == rows.
template <typename T, bool kPadT>
__global__ void tile_fp8_kernel(const T* __restrict__ x, int64_t rows, int64_t n, int64_t ld,
                                uint8_t* __restrict__ codes, float* __restrict__ scales) {
  const int64_t G = (n + 127) / 128;
  const int64_t tile = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (tile >= ld * G) return;
  const int lane = threadIdx.x & 31;
  const int64_t row = tile / G, g = tile % G;
  float v[4];
  bool ok[4];
  uint8_t c[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t col = g * 128 + lane + 32 * j;
    ok[j] = col < n;
    v[j] = ok[j] && (!kPadT || row < rows) ? dev::to_f32(x[row * n + col]) : 0.f;
  }
  float s;
  dev::warp_tile_quant(v, ok, c, &s);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (ok[j]) codes[row * n + g * 128 + lane + 32 * j] = c[j];
  if (lane == 0) scales[kPadT ? g * ld + row : tile] = s;
}

__global__ void mxfp8_dequant_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                     int64_t rows, int64_t n, __nv_bfloat16* __restrict__ y) {
  const int64_t G = (n + 31) / 32;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  const int64_t row = i / n, col = i % n;
  const float2 f = dev::e4m3x2_to_f2(codes[i]);
  y[i] = __float2bfloat16_rn(f.x * dev::e8m0_value(scales[row * G + col / 32]));
}

unsigned blocks_for(int64_t items, int64_t per_block) { return unsigned((items + per_block - 1) / per_block); }

}  // namespace

void mxfp8_quantize(const float* x, int64_t rows, int64_t n, uint8_t* codes, uint8_t* scales, cudaStream_t stream) {
  const int64_t groups = rows * ((n + 31) / 32);
  if (groups == 0) return;
  mxfp8_kernel<float><<<blocks_for(groups, kWarps), kWarps * 32, 0, stream>>>(x, rows, n, codes, scales);
  CUDA_CHECK_LAUNCH();
}

void mxfp8_quantize(const __nv_bfloat16* x, int64_t rows, int64_t n, uint8_t* codes, uint8_t* scales,
                    cudaStream_t stream) {
  const int64_t groups = rows * ((n + 31) / 32);
  if (groups == 0) return;
  mxfp8_kernel<__nv_bfloat16><<<blocks_for(groups, kWarps), kWarps * 32, 0, stream>>>(x, rows, n, codes, scales);
  CUDA_CHECK_LAUNCH();
}

void mxfp8_dequantize_bf16(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t n, __nv_bfloat16* y,
                           cudaStream_t stream) {
  if (rows * n == 0) return;
  mxfp8_dequant_kernel<<<blocks_for(rows * n, 256), 256, 0, stream>>>(codes, scales, rows, n, y);
  CUDA_CHECK_LAUNCH();
}

void kv_fp8_quantize(const float* x, int64_t rows, int64_t n, uint8_t* codes, float* scales, cudaStream_t stream) {
  const int64_t tiles = rows * ((n + 127) / 128);
  if (tiles == 0) return;
  tile_fp8_kernel<float, false><<<blocks_for(tiles, kWarps), kWarps * 32, 0, stream>>>(x, rows, n, rows, codes, scales);
  CUDA_CHECK_LAUNCH();
}

void kv_fp8_quantize(const __nv_bfloat16* x, int64_t rows, int64_t n, uint8_t* codes, float* scales,
                     cudaStream_t stream) {
  const int64_t tiles = rows * ((n + 127) / 128);
  if (tiles == 0) return;
  tile_fp8_kernel<__nv_bfloat16, false><<<blocks_for(tiles, kWarps), kWarps * 32, 0, stream>>>(x, rows, n, rows, codes,
                                                                                              scales);
  CUDA_CHECK_LAUNCH();
}

void act_fp8_quantize(const __nv_bfloat16* x, int64_t rows, int64_t n, int64_t ld, uint8_t* codes, float* scales_t,
                      cudaStream_t stream) {
  DZ_CHECK(ld >= rows, "act_fp8_quantize: ", ld, " padded rows for ", rows);
  const int64_t tiles = ld * ((n + 127) / 128);
  if (tiles == 0) return;
  tile_fp8_kernel<__nv_bfloat16, true><<<blocks_for(tiles, kWarps), kWarps * 32, 0, stream>>>(x, rows, n, ld, codes,
                                                                                             scales_t);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda
