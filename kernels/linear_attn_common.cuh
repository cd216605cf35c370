// Device helpers shared by the linear-attention kernels: gates, activations, warp sums.
#pragma once
#include <cuda_bf16.h>

#include "linear_attn.cuh"

namespace dz::cuda::la {

__device__ __forceinline__ float bf(const bf16 x) { return __bfloat162float(x); }

// torch softplus (beta 1, threshold 20), as the CPU reference.
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// Log-decay from the raw gate input z = f + dt_bias; a = exp(A_log[h]).
__device__ __forceinline__ float gate(float z, float a, float lower_bound) {
  return lower_bound < 0.f ? lower_bound * sigmoid(a * z) : -a * softplus(z);
}

__device__ __forceinline__ float warp_sum(float s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

}  // namespace dz::cuda::la
