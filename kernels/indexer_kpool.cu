// GLM-5.3-Flash's k-pool DSA selection (indexer_kpool.cuh): the pooled keys, then per query the
// head-weighted ReLU scores of the groups from the fp32 products q·kp (a GEMM in the backend) and
// the shared block Top-K.
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

// One block per query: score[p] = sum_h w[h] relu(prod[h, p]) over its visible groups (threads
// along p: the product rows are read coalesced), the block Top-K of them, then the groups' tokens
// and the query's incomplete group in ascending order as the CPU writes them.
__global__ void __launch_bounds__(kThreads) k_kpool_pick(const float* __restrict__ prod, int64_t ld,
                                                         const float* __restrict__ w, int64_t pos0, int H, int P, int Kp,
                                                         bool tail, float* scores, int32_t* groups, int32_t* sel) {
  const int64_t t = blockIdx.x, s = pos0 + t;
  const int nvis = int((s + 1) / P);
  float* sc = scores + t * ld;
  const float* pr = prod + t * H * ld;
  for (int p = threadIdx.x; p < nvis; p += kThreads) {
    float v = 0.f;
    for (int h = 0; h < H; ++h) v += w[t * H + h] * fmaxf(pr[int64_t(h) * ld + p], 0.f);
    sc[p] = v;
  }
  __syncthreads();
  int32_t* g = groups + t * Kp;
  dev::block_topk<kThreads>(sc, nvis, Kp, g);  // ascending group ids, -1 padded
  if (!sel) return;  // the groups are the result (DeepSeek-V4's indexer)
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

void kpool_pick(const float* prod, int64_t ld, const float* w, int64_t T, int64_t pos0, int64_t H, int64_t P,
                int64_t Kp, bool tail, float* scores, int32_t* groups, int32_t* sel, cudaStream_t s) {
  if (T <= 0) return;
  DZ_CHECK(pos0 + T < (int64_t(1) << 31), "kpool_pick: positions beyond int32");
  DZ_CHECK((pos0 + T) / P <= ld, "kpool_pick: ", ld, " product columns for groups up to ", (pos0 + T) / P);
  k_kpool_pick<<<unsigned(T), kThreads, 0, s>>>(prod, ld, w, pos0, int(H), int(P), int(Kp), tail, scores, groups, sel);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dz::cuda
