// FP8 quantization kernels (DESIGN.md §5), bit-identical to the CPU emulation in lib/core/fp8.hpp:
//   MXFP8: E4M3 codes, one E8M0 scale per 32 consecutive elements of a row (Ceil scale rule),
//          for the indexer's Q and K;
//   per-tile FP8: E4M3 codes, one fp32 scale (amax / 448) per 128-element tile of a row, for the
//          latent KV cache of the sparse attention core.
// Rows are contiguous; a row length that is not a multiple of the group gives a shorter last group.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dz::cuda {

// x [rows, n] -> codes [rows, n], scales [rows, ceil(n / 32)] (E8M0 codes).
void mxfp8_quantize(const float* x, int64_t rows, int64_t n, uint8_t* codes, uint8_t* scales, cudaStream_t stream);
void mxfp8_quantize(const __nv_bfloat16* x, int64_t rows, int64_t n, uint8_t* codes, uint8_t* scales,
                    cudaStream_t stream);
// codes/scales as above -> y [rows, n] bf16 (exact: an E4M3 value times a power of two fits bf16
// unless it falls below bf16's normal range).
void mxfp8_dequantize_bf16(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t n, __nv_bfloat16* y,
                           cudaStream_t stream);

// x [rows, n] -> codes [rows, n], scales [rows, ceil(n / 128)] (fp32).
void kv_fp8_quantize(const float* x, int64_t rows, int64_t n, uint8_t* codes, float* scales, cudaStream_t stream);
void kv_fp8_quantize(const __nv_bfloat16* x, int64_t rows, int64_t n, uint8_t* codes, float* scales,
                     cudaStream_t stream);

// The activations of an FP8 block-scaled GEMM (DeepSeek's act_quant, the per-tile rule): x [rows, n]
// -> codes [ld, n], scales_t [ceil(n / 128), ld] (transposed: rows contiguous); rows rows..ld-1 are
// zeros (codes 0, scale 1), so a GEMM may run over ld >= rows rows.
void act_fp8_quantize(const __nv_bfloat16* x, int64_t rows, int64_t n, int64_t ld, uint8_t* codes, float* scales_t,
                      cudaStream_t stream);

}  // namespace dz::cuda
