#include "dsv4_attention.cuh"

#include <cmath>

#include "common.cuh"

namespace dz::cuda {

namespace {

constexpr int kThreads = 128;

__device__ float block_reduce(float v, float* red, bool is_max) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o; o >>= 1) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  __syncthreads();  // red[] free from a previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

__global__ void __launch_bounds__(kThreads) k_dsv4_attention(const __nv_bfloat16* q, const __nv_bfloat16* raw,
                                                             const __nv_bfloat16* comp, int64_t nc, const int32_t* sel,
                                                             int64_t K, const float* sinks, __nv_bfloat16* out,
                                                             int64_t pos0, int H, int D, int64_t W, int64_t m,
                                                             float scale) {
  extern __shared__ float sm[];  // qs [D], lg [keys]
  __shared__ float red[kThreads / 32];
  const int64_t t = blockIdx.x, s = pos0 + t;
  const int h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t w0 = s - W + 1 > 0 ? s - W + 1 : 0, nw = s - w0 + 1;
  const int64_t ncv = sel ? K : (comp && m > 0 ? ((s + 1) / m < nc ? (s + 1) / m : nc) : 0);
  const int64_t n = nw + ncv;
  float* qs = sm;
  float* lg = sm + D;
  const __nv_bfloat16* qh = q + (t * H + h) * D;
  for (int d = threadIdx.x; d < D; d += kThreads) qs[d] = __bfloat162float(qh[d]);
  __syncthreads();
  auto row = [&](int64_t j) -> const __nv_bfloat16* {
    if (j < nw) return raw + (w0 + j) * D;
    if (!sel) return comp + (j - nw) * D;
    const int32_t e = sel[t * K + (j - nw)];
    return e >= 0 && e < nc ? comp + int64_t(e) * D : nullptr;
  };
  for (int64_t j = warp; j < n; j += kThreads / 32) {
    const __nv_bfloat16* r = row(j);
    float d = 0.f;
    if (r)
      for (int c = lane; c < D; c += 32) d += qs[c] * __bfloat162float(r[c]);
    for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (lane == 0) lg[j] = r ? d * scale : -INFINITY;
  }
  __syncthreads();
  const float sink = sinks[h];
  float mx = sink;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) mx = fmaxf(mx, lg[j]);
  mx = block_reduce(mx, red, true);
  float z = 0.f;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) z += (lg[j] = expf(lg[j] - mx));
  z = block_reduce(z, red, false) + expf(sink - mx);
  __syncthreads();
  __nv_bfloat16* o = out + (t * H + h) * D;
  for (int d = threadIdx.x; d < D; d += kThreads) {
    float acc = 0.f;
    for (int64_t j = 0; j < n; ++j) {
      const __nv_bfloat16* r = row(j);
      if (r) acc += lg[j] * __bfloat162float(r[d]);
    }
    o[d] = __float2bfloat16_rn(acc / z);
  }
}

}  // namespace

void dsv4_attention(const __nv_bfloat16* q, const __nv_bfloat16* raw, const __nv_bfloat16* comp, int64_t nc,
                    const int32_t* sel, int64_t K, const float* sinks, __nv_bfloat16* out, int64_t T, int64_t pos0,
                    int64_t H, int64_t D, int64_t W, int64_t m, float scale, cudaStream_t s) {
  if (T <= 0) return;
  const int64_t maxc = sel ? K : (m > 0 ? nc : 0);
  const size_t smem = size_t(D + W + maxc) * sizeof(float);
  DZ_CHECK(smem <= 200 * 1024, "dsv4_attention: ", W, " window rows + ", maxc, " entries do not fit shared memory");
  DZ_CHECK(T < (int64_t(1) << 31) && H < 65536, "dsv4_attention: ", T, " queries x ", H, " heads");
  if (smem > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(k_dsv4_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  k_dsv4_attention<<<dim3(unsigned(T), unsigned(H)), kThreads, smem, s>>>(q, raw, comp, nc, sel, K, sinks, out, pos0,
                                                                         int(H), int(D), W, m, scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda
