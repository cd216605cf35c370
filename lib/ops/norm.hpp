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

}  // namespace dz
