// The gate activation of the gated MLPs and experts on the GPU: the same formulas as the CPU
// reference's glu_act (lib/ops/glu.hpp), in fp32 on the projections' fp32 (or bf16) values.
#pragma once
#include <cuda_runtime.h>

#include "ops/glu.hpp"

namespace dz::cuda {

// act(g, u): SwiGLU (fast exp: ~2 ulp, far below the bf16 rounding), its clamp, or SiTU (tanhf).
__device__ __forceinline__ float glu_dev(const GluAct& a, float g, float u) {
  if (a.limit > 0.f) g = fminf(g, a.limit), u = fminf(fmaxf(u, -a.limit), a.limit);
  if (a.situ_beta > 0.f) {
    const float b = a.situ_beta, lb = a.situ_linear_beta;
    const float sg = __fdividef(1.f, 1.f + __expf(-g));
    return b * tanhf(g / b) * sg * (lb > 0.f ? lb * tanhf(u / lb) : u);
  }
  return __fdividef(g, 1.f + __expf(-g)) * u;
}

}  // namespace dz::cuda
