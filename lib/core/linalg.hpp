// Dense fp32 building blocks for the CPU reference backend. Deterministic: every output element
// is reduced in a fixed order that does not depend on T, the thread count or the rank layout.
#pragma once
#include <cstdint>

namespace dz {

// sum_i a[i] * b[i], reduced in 8 fixed lanes then pairwise.
float dot(const float* a, const float* b, int64_t n);

// y[T, out] = x[T, in] · W[out, in]^T (+ bias[out]); W in Hugging Face (out, in) layout.
void linear(const float* x, const float* W, const float* bias, float* y, int64_t T, int64_t in, int64_t out);

// y[T, out] += x[T, in] · W[out, in]^T
void linear_acc(const float* x, const float* W, float* y, int64_t T, int64_t in, int64_t out);

inline float silu(float x) { return x / (1.f + __builtin_expf(-x)); }
inline float sigmoid(float x) { return 1.f / (1.f + __builtin_expf(-x)); }
float softplus(float x);

}  // namespace dz
