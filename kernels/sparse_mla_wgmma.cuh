// The Hopper (wgmma) sparse MLA kernel for the latent cache with R = 512 (BF16 at DR 0 / 64, FP8 at
// DR 64); sparse_mla() (the public entry, sparse_mla.cuh) routes to it. Internal to kernels/.
#pragma once
#include "sparse_mla.cuh"

namespace dz::cuda {

// True when the wgmma kernel handles the call: (R, DR) = (512, 0) BF16 / (512, 64) BF16 or FP8, one part
// per (query, head block) (nsplit == 1: no split-KV), 0 < nq < 65536.
bool sparse_mla_wgmma_takes(const LatentCache& cache, int64_t nq, int nsplit);
// Requires sparse_mla_wgmma_takes(cache, nq, 1); K >= 1, H >= 1.
void sparse_mla_wgmma(const __nv_bfloat16* q, const int32_t* sel, int32_t K, const int32_t* seq, const int32_t* pos,
                      int64_t nq, int32_t H, const BlockTable& bt, const LatentCache& cache, float scale,
                      __nv_bfloat16* out, cudaStream_t stream);

}  // namespace dz::cuda
