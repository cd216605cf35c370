// Short causal depthwise convolution + SiLU on the GPU (the q/k/v short conv of KDA and Gated
// DeltaNet). CPU reference: lib/ops/short_conv.hpp (same formula and state convention: the state
// holds the last W-1 inputs, row 0 the oldest). BF16 activations and weights, fp32 accumulation;
// the state holds inputs, which are BF16 values, so it is stored as BF16 losslessly.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dz::cuda {

// Varlen prefill. x, y [T_total, C]; w [C, W]; bias [C] or nullptr; cu_seqlens [N + 1] (device);
// state [N, W-1, C] in/out (nullptr: zero history, nothing written). y must not alias x.
void short_conv_prefill(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                        const int32_t* cu_seqlens, int N, int64_t T_total, int C, int W, __nv_bfloat16* state,
                        __nv_bfloat16* y, cudaStream_t stream);

// One decode step per sequence. x, y [B, C]; states [num_slots, W-1, C], sequence i uses slot[i]
// (device; negative: skipped), updated in place.
void short_conv_update(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                       const int32_t* slot, int B, int C, int W, __nv_bfloat16* states, __nv_bfloat16* y,
                       cudaStream_t stream);

}  // namespace dz::cuda
