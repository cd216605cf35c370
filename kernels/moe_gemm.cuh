// Tensor-core grouped GEMMs for MoE experts (Hopper wgmma m64n256k16 bf16, fp32 accumulate), the
// replacement of backend_ops' SIMT grouped_gemm. Same row layout as moe_dispatch writes it.
//
// Grouped GEMM over experts: for rows r of expert e (offsets[e] <= r < offsets[e+1]),
//   y[r, :] = xs[r, :] . W[e]^T,  W [E, N, K] bf16 (row-major, each expert N x K), xs [*, K] bf16,
//   y [*, N] bf16 (fp32 accumulate, one rounding at the end).
// offsets [E+1] device (exclusive scan of rows per expert); tile_off [E+1] device = exclusive scan
// over experts of ceil(rows_e / 64) (64-row tiles, as moe_dispatch writes it); max_tiles >= tile_off[E]
// is host-known (grid size). Rows of one expert are contiguous. The host never reads offsets.
// Any N, K >= 1; experts may have 0 rows. Deterministic: each output element is one fixed-order
// fp32 reduction over K (steps of 16 inside wgmma, ascending), whatever tile or block computes it.
// Limits: N, K < 2^31, rows < 2^31, E <= 4096 (offsets are staged in shared memory).
// The kernels derive everything from offsets; tile_off is accepted for the contract and unused.
// The plain GEMMs with N >= 2048 and K >= 2048 run the swap-AB kernel (tokens on wgmma's N side: an
// expert's rows pad to 16, not 128; DZ_MOE_GEMM_SWAPAB=1 for every shape, =0 for none).
// DZ_MOE_GEMM_CLUSTERS=1 runs the plain GEMMs as 2-CTA clusters (moe_gemm.cu, clusters(): not the
// default). Every choice gives bitwise-equal outputs.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/glu.hpp"

namespace dz::cuda {

// Whether grouped_gemm_tc at this shape gathers the rows in its loaders at no cost to the GEMM;
// false: gather_rows once and pass the copy (arow = nullptr).
bool grouped_gemm_gathers_rows(int64_t N, int64_t K);

// arow: the rows gathered by the GEMM's loaders: row r is xs[arow[r] / top_k] with xs the tokens
// [T, K] and arow moe_dispatch's perm (bitwise gather_rows(xs, arow, ...) then the GEMM, without the
// gathered copy written and read back); nullptr: row r is xs[r]. Worth it only where
// grouped_gemm_gathers_rows(N, K) (otherwise the GEMM runs on a kernel slower than the swap-AB one
// that a gathered copy would get).
void grouped_gemm_tc(const __nv_bfloat16* xs, const __nv_bfloat16* W, const int32_t* offsets,
                     const int32_t* tile_off, int E, int64_t max_tiles, int64_t N, int64_t K,
                     __nv_bfloat16* y, cudaStream_t s, const int32_t* arow = nullptr, int top_k = 1);

// Fused gate/up of a gated expert: h[r, :] = act(xs[r] . Wg[e]^T, xs[r] . Wu[e]^T), both in fp32
// before the activation (ops/glu.hpp: SwiGLU, its clamp, SiTU), h bf16 [*, N]. (Saves a pass over h
// and one over xs, yet the H200 runs it 1.2-1.4x slower than two grouped_gemm_tc calls plus the
// activation pass, so the CUDA backend's BF16 experts take those; kernels/dev/moe_gemm benches both.
// The MXFP4 version below is the one the model path uses.)
void grouped_gemm_swiglu_tc(const __nv_bfloat16* xs, const __nv_bfloat16* Wg, const __nv_bfloat16* Wu,
                            const int32_t* offsets, const int32_t* tile_off, int E, int64_t max_tiles,
                            int64_t N, int64_t K, __nv_bfloat16* h, cudaStream_t s, const GluAct& act = GluAct{});

// The same two with MXFP4 weights kept 4-bit (Kimi K3's routed experts, core/fp8.hpp MXFP4): W [E, N, K]
// as E2M1 pairs packed [E, N, K/2] (even k in the low nibble) and E8M0 scales [E, N, K/32]; K a
// multiple of 32, xs 16-byte aligned. Each B tile is decoded to bf16 in shared memory (exact: an
// MXFP4 value has one mantissa bit), so the products equal the bf16 kernels' on the decoded weights.
struct Mx4Weight {
  const uint8_t* packed = nullptr;
  const uint8_t* scales = nullptr;
};
void grouped_gemm_mx4_tc(const __nv_bfloat16* xs, const Mx4Weight& W, const int32_t* offsets, int E, int64_t max_tiles,
                         int64_t N, int64_t K, __nv_bfloat16* y, cudaStream_t s);
void grouped_gemm_glu_mx4_tc(const __nv_bfloat16* xs, const Mx4Weight& Wg, const Mx4Weight& Wu,
                             const int32_t* offsets, int E, int64_t max_tiles, int64_t N, int64_t K,
                             __nv_bfloat16* h, cudaStream_t s, const GluAct& act);

}  // namespace dz::cuda
