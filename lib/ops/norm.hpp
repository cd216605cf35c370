// Normalisations (CPU reference, fp32).
#pragma once
#include <cstdint>

namespace dz {

enum class GateAct { SiLU, Sigmoid };

// y[r, :] = x[r, :] / sqrt(mean(x^2) + eps) * w   (w applied as (1 + w) when zero_centered;
// w == nullptr: no weight). rows × D, y may alias x.
void rmsnorm(const float* x, const float* w, float* y, int64_t rows, int64_t D, float eps,
             bool zero_centered = false);

// Gated RMSNorm: y = rmsnorm(x) * w * act(gate)   (fla FusedRMSNormGated / qwen3_next norm).
void gated_rmsnorm(const float* x, const float* gate, const float* w, float* y, int64_t rows, int64_t D,
                   float eps, GateAct act, bool zero_centered = false);

// y[r, :] = x[r, :] / sqrt(sum(x^2) + eps)   (as fla's l2norm); y may alias x.
void l2norm(const float* x, float* y, int64_t rows, int64_t D, float eps = 1e-6f);

// Block AttnRes depth mixture (model/attn_res.hpp), per token t over the values
// v = [blocks[0][t], ..., blocks[n_blocks-1][t], partial[t]] (blocks [n_blocks, T, D], partial [T, D]):
//   score_i = q · v_i / sqrt(mean(v_i^2) + eps),  out[t] = sum_i softmax(score)_i v_i.
// q [D] is the site's pseudo-query (w_norm ⊙ w_proj).
void attn_res_mix(const float* blocks, int64_t n_blocks, const float* partial, const float* q, int64_t T, int64_t D,
                  float eps, float* out);

}  // namespace dz
