// Manifold-constrained hyper-connections (mHC; GLM-5.3-Flash, DeepSeek-V4): the residual stream is
// N streams [N, D] per token. Around each sub-layer (token mixer, FFN), from the streams x:
//   r    = rsqrt(mean(x²) + eps_norm) over all N·D values             (an unweighted RMSNorm)
//   m    = r · (x_flat · fnᵀ)                                          [(2+N)·N], fn [(2+N)N, N·D]
//   pre  = sigmoid(m[0:N]·s0 + base[0:N]) + eps_hc                     [N]
//   post = 2·sigmoid(m[N:2N]·s1 + base[N:2N])                          [N]
//   comb = softmax_row(m[2N:]·s2 + base[2N:]) + eps_hc                 [N, N] (row = input stream)
//          then Sinkhorn: columns normalised (÷ (col sum + eps_hc)), then iters − 1 times rows, columns
//   in   = Σ_n pre[n] · x[n]                                           the sub-layer's input [D]
//   x'[m] = post[m] · y + Σ_n comb[n][m] · x[n]                        y = the sub-layer's output [D]
// The stack starts with every stream equal to the embedding; GLM's head is the mean of the streams.
// (transformers 5.23 glm5_next: Glm5NextTextHyperConnection, Glm5NextTextDecoderLayer.)
#pragma once
#include <cstdint>

namespace dz {

struct HcParams {
  int64_t N = 0;        // hc_mult
  int iters = 20;       // hc_sinkhorn_iters
  float eps_norm = 1e-6f, eps_hc = 1e-6f;
};

// coeff [T, (2+N)N] = pre | post | comb (after Sinkhorn) and in [T, D] from streams x [T, N·D].
void hc_pre(const float* x, const float* fn, const float* base, const float* scale, const HcParams& p, int64_t T,
            int64_t D, float* coeff, float* in);
// The coefficients of one token from its projection m [(2+N)N] (already multiplied by r).
void hc_coeffs(const float* m, const float* base, const float* scale, const HcParams& p, float* coeff);
// x [T, N·D] <- post ⊗ y + combᵀ x  (y [T, D]).
void hc_post(float* x, const float* coeff, const float* y, int64_t N, int64_t T, int64_t D);

}  // namespace dz
