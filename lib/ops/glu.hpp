// The gate activation of a gated MLP (every dense MLP, shared and routed expert): a = act(g, u) of
// the gate projection g and the up projection u, then down(a). One definition for the CPU
// reference; the CUDA kernels implement the same (kernels/glu.cuh).
//   SwiGLU         : silu(g) · u
//   SwiGLU clamp   : silu(min(g, L)) · clamp(u, −L, L)       (limit L > 0: GLM-5.3-Flash, DeepSeek-V4)
//   SiTU (Kimi K3) : β·tanh(g/β)·sigmoid(g) · λ·tanh(u/λ)    (situ_beta β > 0; situ_linear_beta λ > 0,
//                                                            0: the up branch unbounded)
#pragma once
#include <algorithm>
#include <cmath>

#include "core/linalg.hpp"

namespace dz {

struct GluAct {
  float limit = 0.f;             // SwiGLU clamp; 0: none
  float situ_beta = 0.f;         // > 0: SiTU instead of SiLU
  float situ_linear_beta = 0.f;  // SiTU's bound on the up branch; 0: none
  bool operator==(const GluAct& o) const {
    return limit == o.limit && situ_beta == o.situ_beta && situ_linear_beta == o.situ_linear_beta;
  }
};

inline float glu_act(const GluAct& a, float g, float u) {
  if (a.limit > 0.f) g = std::min(g, a.limit), u = std::min(std::max(u, -a.limit), a.limit);
  if (a.situ_beta > 0.f) {
    const float b = a.situ_beta, lb = a.situ_linear_beta;
    return b * std::tanh(g / b) * sigmoid(g) * (lb > 0.f ? lb * std::tanh(u / lb) : u);
  }
  return silu(g) * u;
}

}  // namespace dz
