// Fused quantize-and-store kernels for the paged caches (layouts in paged_cache.cuh).
#include "common.cuh"
#include "paged_cache.cuh"
#include "quant_device.cuh"

namespace dz::cuda {

namespace {

__device__ __forceinline__ int64_t slot_of(const BlockTable& bt, int32_t seq, int32_t pos) {
  return int64_t(bt.table[int64_t(seq) * bt.max_pages + pos / bt.page_size]) * bt.page_size + pos % bt.page_size;
}

// One block (4 warps) per token. FP8: warp w quantizes tiles w, w+4, ... of the latent.
__global__ void store_latent_kernel(const __nv_bfloat16* __restrict__ kv, const __nv_bfloat16* __restrict__ kpe,
                                    const int32_t* __restrict__ seq, const int32_t* __restrict__ pos, BlockTable bt,
                                    LatentCache c) {
  const int64_t i = blockIdx.x;
  const int64_t slot = slot_of(bt, seq[i], pos[i]);
  const int R = c.R, DR = c.DR;
  const __nv_bfloat16* x = kv + i * R;
  const __nv_bfloat16* xr = kpe + i * DR;
  if (!c.fp8) {
    __nv_bfloat16* dst = c.bf16 + slot * (R + DR);
    for (int j = threadIdx.x; j < R; j += blockDim.x) dst[j] = x[j];
    for (int j = threadIdx.x; j < DR; j += blockDim.x) dst[R + j] = xr[j];
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int tiles = R / 128;
  for (int t = warp; t < tiles; t += blockDim.x / 32) {
    float v[4];
    bool ok[4];
    uint8_t code[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      ok[j] = true;
      v[j] = __bfloat162float(x[t * 128 + lane + 32 * j]);
    }
    float s;
    dev::warp_tile_quant(v, ok, code, &s);
#pragma unroll
    for (int j = 0; j < 4; ++j) c.codes[slot * R + t * 128 + lane + 32 * j] = code[j];
    if (lane == 0) c.scales[slot * tiles + t] = s;
  }
  for (int j = threadIdx.x; j < DR; j += blockDim.x) c.rope[slot * DR + j] = xr[j];
}

// One warp per (token, 32-group).
__global__ void store_index_kernel(const __nv_bfloat16* __restrict__ k, const int32_t* __restrict__ seq,
                                   const int32_t* __restrict__ pos, int64_t N, BlockTable bt, IndexKeyCache c) {
  const int G = c.D / 32;
  const int64_t grp = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (grp >= N * G) return;
  const int lane = threadIdx.x & 31;
  const int64_t i = grp / G;
  const int g = int(grp % G);
  const int64_t slot = slot_of(bt, seq[i], pos[i]);
  const __nv_bfloat16 xv = k[i * c.D + g * 32 + lane];
  if (!c.mxfp8) {
    c.bf16[slot * c.D + g * 32 + lane] = xv;
    return;
  }
  uint8_t s;
  const uint8_t code = dev::warp_mx_quant(__bfloat162float(xv), true, &s);
  c.codes[slot * c.D + g * 32 + lane] = code;
  if (lane == 0) c.scales[slot * G + g] = s;
}

}  // namespace

void store_latent_kv(const __nv_bfloat16* kv, const __nv_bfloat16* kpe, const int32_t* seq, const int32_t* pos,
                     int64_t N, const BlockTable& bt, const LatentCache& cache, cudaStream_t stream) {
  DZ_CHECK(!cache.fp8 || cache.R % 128 == 0, "store_latent_kv: FP8 latent cache needs R % 128 == 0, got ", cache.R);
  if (N == 0) return;
  store_latent_kernel<<<unsigned(N), 128, 0, stream>>>(kv, kpe, seq, pos, bt, cache);
  CUDA_CHECK_LAUNCH();
}

void store_index_k(const __nv_bfloat16* k, const int32_t* seq, const int32_t* pos, int64_t N, const BlockTable& bt,
                   const IndexKeyCache& cache, cudaStream_t stream) {
  DZ_CHECK(cache.D % 32 == 0, "store_index_k: index head dim ", cache.D, " must be a multiple of 32");
  const int64_t groups = N * (cache.D / 32);
  if (groups == 0) return;
  store_index_kernel<<<unsigned((groups + 7) / 8), 256, 0, stream>>>(k, seq, pos, N, bt, cache);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda
