// Short causal depthwise convolution + SiLU on the GPU (the q/k/v short conv of KDA and Gated
// DeltaNet). CPU reference: lib/ops/short_conv.hpp (same formula and state convention: the state
// holds the last W-1 inputs, row 0 the oldest). BF16 activations and weights, fp32 accumulation;
// the state holds inputs, which are BF16 values, so it is stored as BF16 losslessly.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dz::cuda {

// The prefill's output split by columns: channels [c0[s], c0[s + 1]) go to y[s], a row-major
// [T_total, c0[s + 1] - c0[s]] tensor (the linear-attention mixers' q | k | v, written where the
// scan reads them instead of copied there). n = 1, c0 = {0, C}: the plain [T_total, C] output.
struct ConvOut {
  static constexpr int kMax = 3;
  int n = 1;
  __nv_bfloat16* y[kMax] = {};
  int c0[kMax + 1] = {};
};

// Varlen prefill. x [T_total, C]; w [C, W]; bias [C] or nullptr; cu_seqlens [N + 1] (device);
// state [N, W-1, C] in/out (nullptr: zero history, nothing written); out must not alias x.
void short_conv_prefill(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                        const int32_t* cu_seqlens, int N, int64_t T_total, int C, int W, __nv_bfloat16* state,
                        const ConvOut& out, cudaStream_t stream);
// The same into one y [T_total, C].
void short_conv_prefill(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                        const int32_t* cu_seqlens, int N, int64_t T_total, int C, int W, __nv_bfloat16* state,
                        __nv_bfloat16* y, cudaStream_t stream);

// One decode step per sequence. x, y [B, C]; states [num_slots, W-1, C], sequence i uses slot[i]
// (device; negative: skipped), updated in place.
void short_conv_update(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias,
                       const int32_t* slot, int B, int C, int W, __nv_bfloat16* states, __nv_bfloat16* y,
                       cudaStream_t stream);

}  // namespace dz::cuda
