// GLM-5.3-Flash's k-pool DSA selection (formulas and CPU reference: lib/ops/indexer.hpp
// kpool_pooled_keys / kpool_select).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dz::cuda {

// kp [S / P, D] fp32: the pooled keys of the complete groups of cache [S, 2D] (key | gate, bf16).
void kpool_pooled_keys(const __nv_bfloat16* cache, const float* ape, int64_t S, int64_t D, int64_t P, float* kp,
                       cudaStream_t s);
// sel [T, Kp·P + (tail ? P − 1 : 0)] for queries q [T, H·D] bf16 at pos0.., w [T, H] fp32 (already
// scaled), over kp [NP, D]; scratch: scores [T, NP] fp32 and groups [T, Kp] int32.
void kpool_select(const __nv_bfloat16* q, const float* w, const float* kp, int64_t NP, int64_t T, int64_t pos0,
                  int64_t H, int64_t D, int64_t P, int64_t Kp, bool tail, float* scores, int32_t* groups, int32_t* sel,
                  cudaStream_t s);

}  // namespace dz::cuda
