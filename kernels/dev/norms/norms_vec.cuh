// Experiment (issue 11: "norms, RoPE, elementwise, copies" 12.3 ms and the shared-expert add 2.3 ms of
// Qwen3.5's 8-layer forward at T = 32768, ncu at a587317; the norms run at ~1.8-1.9 TB/s of the
// H200's 4.8): the row norms, the residual add and the shared-expert add with 16-byte vector
// loads. Written 2026-12-02 after the session's device time was spent: compiled, NOT yet run.
//   bash kernels/dev/norms/run.sh     (test against fp64 and bench beside production, one command)
// Same semantics as backend_ops.cuh's rmsnorm / gated_rmsnorm / add / shared_expert_add; they take
// rows of D % 8 == 0 with 16-byte aligned pointers (every model shape) and return false otherwise,
// for the caller to take the production kernel.
//   - norms: a row is read by L = min(32, largest power of two <= D / 8) lanes of a warp (D = 128:
//     two rows a warp), 8 elements a lane per load; the lane's first kCache chunks stay in
//     registers for the second pass (D <= 2048 at L = 32: the whole row), the rest is re-read;
//   - add (h += y): 8 elements a thread, h F32 or BF16, y F32 or BF16;
//   - shared-expert add: one block per token as production, 8 elements a thread.
// Summation order (fixed, so still deterministic): per lane over its chunks ascending, then a
// butterfly over the L lanes; production sums per lane over d = lane, lane + 32, ... The results
// differ from production's by fp32 rounding only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dz::cuda::dev {

// act: 0 SiLU, 1 sigmoid (as backend_ops' gated_rmsnorm). *_f32 / *_bf16 name the element types.
template <class TX, class TY>
bool rmsnorm_vec(const TX* x, const float* w, TY* y, int64_t rows, int64_t D, float eps, bool zc, cudaStream_t s);
template <class TX, class TG, class TY>
bool gated_rmsnorm_vec(const TX* x, const TG* gate, const float* w, TY* y, int64_t rows, int64_t D, float eps, int act,
                       cudaStream_t s);
template <class TH, class TY>
bool add_vec(TH* h, const TY* y, int64_t n, cudaStream_t s);
bool shared_expert_add_vec(const __nv_bfloat16* x, const float* gate, const __nv_bfloat16* sh, int64_t T, int64_t D,
                           __nv_bfloat16* y, cudaStream_t s);

}  // namespace dz::cuda::dev
