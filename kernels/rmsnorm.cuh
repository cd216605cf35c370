// RMSNorm on the GPU: bf16 in/out, fp32 statistics (DESIGN.md §5). CPU reference: ops/norm.hpp.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dz::cuda {

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (w or 1 + w), rows × D, one block per row.
void rmsnorm_bf16(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, int64_t rows, int64_t D,
                  float eps, bool zero_centered, cudaStream_t stream);

}  // namespace dz::cuda
