// mHC hyper-connection kernels (ops/hyper.hpp has the formulas and the CPU reference). Streams
// x [T, N·D] fp32. The projection x·fnᵀ is a cuBLAS fp32 GEMM in the backend; these do the rest.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace dz::cuda {

struct HcKernelParams {
  int N = 0, iters = 20;
  float eps_norm = 1e-6f, eps_hc = 1e-6f;
};

// m [T, (2+N)N] = x·fnᵀ (unscaled) -> coeff [T, (2+N)N] (pre | post | comb after Sinkhorn) and
// in [T, D] = Σ_n pre[n] x[n]. One block per token (N <= 8). ss [T] = Σ x² over the token's N·D
// values when the caller has it (hc_post_proj), nullptr: summed here.
void hc_pre(const float* x, const float* m, const float* ss, const float* base, const float* scale,
            const HcKernelParams& p, int64_t T, int64_t D, float* coeff, float* in, cudaStream_t s);
// hc_post and, from the new streams in the same pass, the next sub-layer's projection m [T, 24] =
// x·fnᵀ (fn [24, 4D]) and ss [T] = Σx², for hc_pre: N = 4 and D % 128 == 0 with 16-byte aligned
// x, y, fn only (hc_post_proj_fits; the backend runs hc_post + its GEMM otherwise).
bool hc_post_proj_fits(int N, int64_t D, const float* x, const void* y, bool y_bf16, const float* fn);
void hc_post_proj(float* x, const float* coeff, const void* y, bool y_bf16, int N, int64_t T, int64_t D,
                  const float* fn, float* m, float* ss, cudaStream_t s);
// x [T, N·D] <- post ⊗ y + combᵀ x, y [T, D] bf16 (act) or fp32.
void hc_post(float* x, const float* coeff, const void* y, bool y_bf16, int N, int64_t T, int64_t D, cudaStream_t s);
// x [T, N·D] = h [T, D] in each stream;  out [T, D] = mean over the streams.
void hc_expand(const float* h, int N, int64_t T, int64_t D, float* x, cudaStream_t s);
void hc_mean(const float* x, int N, int64_t T, int64_t D, float* out, cudaStream_t s);

}  // namespace dz::cuda
