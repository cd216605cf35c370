// mHC hyper-connection kernels (ops/hyper.hpp has the formulas and the CPU reference). Streams
// x [T, N·D] fp32. The projection x·fnᵀ is a cuBLAS fp32 GEMM in the backend for hc_pre; hc_post_coeff
// computes it itself.
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
// in [T, D] = Σ_n pre[n] x[n]. One block per token (N <= 8). bc: x is [T, D], every stream equal to it.
void hc_pre(const float* x, const float* m, const float* base, const float* scale, const HcKernelParams& p, int64_t T,
            int64_t D, float* coeff, float* in, cudaStream_t s, bool bc = false);
// fs [C, D] = fn [C, N·D] summed over its N stream blocks (x · fnᵀ = h · fsᵀ when every stream is h).
void hc_fn_sum(const float* fn, int64_t C, int N, int64_t D, float* fs, cudaStream_t s);
// hc_post and, from the new streams in the same pass, the next sub-layer's coefficients coeff_next
// [T, 24] (fn [24, 4D], base, scale; coeff_next may be coeff): N = 4 and D % 128 == 0 with 16-byte
// aligned x, y, fn only (hc_post_coeff_fits; the backend runs hc_post + hc_pre otherwise). Then
// hc_collapse_norm: out [T, D] (bf16 or fp32) = rmsnorm(Σ_n pre[n] x[n]) with weight w (nullptr:
// none; zc: 1 + w), the sub-layer's normed input without its fp32 row (N = 4, D % 4 == 0).
// bc (hc_post_coeff): the old streams are all bc [T, D] (x is written, not read).
bool hc_post_coeff_fits(int N, int64_t D, const float* x, const void* y, bool y_bf16, const float* fn,
                        const float* bc = nullptr);
void hc_post_coeff(float* x, const float* coeff, const void* y, bool y_bf16, int N, int64_t T, int64_t D, const float* fn,
                   const float* base, const float* scale, const HcKernelParams& p, float* coeff_next, cudaStream_t s,
                   const float* bc = nullptr);
void hc_collapse_norm(const float* x, const float* coeff, int N, int64_t T, int64_t D, const float* w, float eps, bool zc,
                      void* out, bool out_bf16, cudaStream_t s);
// x [T, N·D] <- post ⊗ y + combᵀ x, y [T, D] bf16 (act) or fp32. mean: x is not written; mean [T, D]
// = the new streams' mean (bitwise hc_post then hc_mean).
void hc_post(float* x, const float* coeff, const void* y, bool y_bf16, int N, int64_t T, int64_t D, cudaStream_t s,
             float* mean = nullptr);
// x [T, N·D] = h [T, D] in each stream;  out [T, D] = mean over the streams.
void hc_expand(const float* h, int N, int64_t T, int64_t D, float* x, cudaStream_t s);
void hc_mean(const float* x, int N, int64_t T, int64_t D, float* out, cudaStream_t s);

}  // namespace dz::cuda
