#include "common.cuh"
#include "rmsnorm.cuh"

namespace dz::cuda {

namespace {

// One block per row; each thread strides the row, then a warp-shuffle + shared-memory reduction.
__global__ void rmsnorm_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                               __nv_bfloat16* __restrict__ y, int64_t D, float eps, bool zero_centered) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* xr = x + row * D;
  __nv_bfloat16* yr = y + row * D;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float v = __bfloat162float(xr[i]);
    ss += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) part[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    ss = lane < (blockDim.x + 31) / 32 ? part[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) part[0] = ss;
  }
  __syncthreads();
  const float inv = rsqrtf(part[0] / float(D) + eps);
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float g = w ? __bfloat162float(w[i]) : 0.f;
    g = w ? (zero_centered ? 1.f + g : g) : 1.f;
    yr[i] = __float2bfloat16(__bfloat162float(xr[i]) * inv * g);
  }
}

}  // namespace

void rmsnorm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int64_t rows, int64_t D,
                  float eps, bool zero_centered, cudaStream_t stream) {
  if (rows == 0) return;
  int threads = D >= 1024 ? 1024 : int((D + 31) / 32 * 32);
  rmsnorm_kernel<<<unsigned(rows), threads, 0, stream>>>(x, w, y, D, eps, zero_centered);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda
