// DeepSeek-V4's shared-KV attention over the sliding window and compressed entries (definition:
// lib/ops/attention.hpp dsv4_attention). Correct first: one block per (query, head), the logits in
// shared memory, the rows read from global memory twice; no tensor cores yet.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dz::cuda {

// q, out [T, H, D] bf16; raw [>= pos0 + T, D], comp [nc, D] bf16 (nullptr when nc == 0); sel [T, K]
// (nullptr: every entry e < (s + 1) / m); sinks [H] fp32.
void dsv4_attention(const __nv_bfloat16* q, const __nv_bfloat16* raw, const __nv_bfloat16* comp, int64_t nc,
                    const int32_t* sel, int64_t K, const float* sinks, __nv_bfloat16* out, int64_t T, int64_t pos0,
                    int64_t H, int64_t D, int64_t W, int64_t m, float scale, cudaStream_t s);

}  // namespace dz::cuda
