// GLM-5.3-Flash's k-pool DSA selection (indexer_kpool.cuh). Correctness first: one block per query
// scores its visible groups (a warp per group), the shared block Top-K picks Kp of them; the
// groups' tokens and the query's incomplete group follow in ascending order as the CPU writes them.
#include "indexer_kpool.cuh"

#include <cmath>

#include "common.cuh"
#include "indexer_topk_device.cuh"

namespace dz::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void k_kpool_keys(const __nv_bfloat16* cache, const float* ape, int64_t NP, int64_t D, int64_t P, float* kp) {
  const int64_t p = blockIdx.x;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < P; ++j) mx = fmaxf(mx, __bfloat162float(cache[(p * P + j) * 2 * D + D + c]) + ape[j * D + c]);
    float sum = 0.f, acc = 0.f;
    for (int64_t j = 0; j < P; ++j) sum += expf(__bfloat162float(cache[(p * P + j) * 2 * D + D + c]) + ape[j * D + c] - mx);
    for (int64_t j = 0; j < P; ++j) {
      const float e = expf(__bfloat162float(cache[(p * P + j) * 2 * D + D + c]) + ape[j * D + c] - mx);
      acc += e / sum * __bfloat162float(cache[(p * P + j) * 2 * D + c]);
    }
    kp[p * D + c] = acc;
  }
}

__global__ void __launch_bounds__(kThreads) k_kpool_select(const __nv_bfloat16* q, const float* w, const float* kp,
                                                           int64_t NP, int64_t pos0, int H, int D, int P, int Kp,
                                                           bool tail, float* scores, int32_t* groups, int32_t* sel) {
  extern __shared__ float qs[];  // [H * D]
  const int64_t t = blockIdx.x, s = pos0 + t;
  const int nvis = int((s + 1) / P);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = kThreads / 32;
  for (int i = threadIdx.x; i < H * D; i += kThreads) qs[i] = __bfloat162float(q[t * H * D + i]);
  __syncthreads();
  float* sc = scores + t * NP;
  for (int p = warp; p < nvis; p += nw) {
    float v = 0.f;
    for (int h = 0; h < H; ++h) {
      float d = 0.f;
      for (int c = lane; c < D; c += 32) d += qs[h * D + c] * kp[int64_t(p) * D + c];
      for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      v += w[t * H + h] * fmaxf(d, 0.f);
    }
    if (lane == 0) sc[p] = v;
  }
  __syncthreads();
  int32_t* g = groups + t * Kp;
  dev::block_topk<kThreads>(sc, nvis, Kp, g);  // ascending group ids, -1 padded
  __syncthreads();
  const int nsel = nvis < Kp ? nvis : Kp, ntail = tail ? int((s + 1) % P) : 0, width = Kp * P + (tail ? P - 1 : 0);
  int32_t* out = sel + t * width;
  for (int i = threadIdx.x; i < width; i += kThreads) {
    int32_t v = -1;
    if (i < nsel * P)
      v = g[i / P] * P + i % P;
    else if (i < nsel * P + ntail)
      v = int32_t(int64_t(nvis) * P + (i - nsel * P));
    out[i] = v;
  }
}

}  // namespace

void kpool_pooled_keys(const __nv_bfloat16* cache, const float* ape, int64_t S, int64_t D, int64_t P, float* kp,
                       cudaStream_t s) {
  const int64_t NP = S / P;
  if (NP <= 0) return;
  k_kpool_keys<<<unsigned(NP), 128, 0, s>>>(cache, ape, NP, D, P, kp);
  CUDA_CHECK_LAUNCH();
}

void kpool_select(const __nv_bfloat16* q, const float* w, const float* kp, int64_t NP, int64_t T, int64_t pos0,
                  int64_t H, int64_t D, int64_t P, int64_t Kp, bool tail, float* scores, int32_t* groups, int32_t* sel,
                  cudaStream_t s) {
  if (T <= 0) return;
  const size_t smem = size_t(H * D) * sizeof(float);
  DZ_CHECK(smem <= 200 * 1024, "kpool_select: ", H, " heads x ", D, " do not fit shared memory");
  DZ_CHECK(pos0 + T < (int64_t(1) << 31), "kpool_select: positions beyond int32");
  if (smem > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(k_kpool_select, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  k_kpool_select<<<unsigned(T), kThreads, smem, s>>>(q, w, kp, NP, pos0, int(H), int(D), int(P), int(Kp), tail, scores,
                                                     groups, sel);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda
