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
// sel [T, Kp·P + (tail ? P − 1 : 0)] for queries at pos0.. from prod [T·H, ld] fp32 = q_h · kp_p
// (row t·H + h, column p; ld >= (pos0 + T) / P, the groups the last query sees) and w [T, H] fp32
// (already scaled); scratch: scores [T, ld] fp32 and groups [T, Kp] int32. sel == nullptr: the
// groups themselves are the result (ascending, -1 padded: ops/indexer.hpp group_select).
void kpool_pick(const float* prod, int64_t ld, const float* w, int64_t T, int64_t pos0, int64_t H, int64_t P,
                int64_t Kp, bool tail, float* scores, int32_t* groups, int32_t* sel, cudaStream_t s);

}  // namespace dz::cuda
