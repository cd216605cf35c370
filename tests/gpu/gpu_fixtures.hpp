// Shared by the GPU tests: a device buffer and bf16 conversions of host vectors.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.cuh"
#include "core/bf16.hpp"

namespace dz::gputest {

// Device buffer of T (zeroed), freed on scope exit.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)));
    zero();
  }
  Dev(const std::vector<T>& h) : Dev(h.size()) { up(h); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  void zero() { CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(1, n) * sizeof(T))); }
  void up(const std::vector<T>& h) { CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> down() const {
    std::vector<T> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

inline float bf(const __nv_bfloat16& v) {
  uint16_t b;
  std::memcpy(&b, static_cast<const void*>(&v), 2);
  return bf16_to_f32(b);
}
inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& x) {
  std::vector<__nv_bfloat16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t b = f32_to_bf16(x[i]);
    std::memcpy(static_cast<void*>(&y[i]), &b, 2);
  }
  return y;
}
inline std::vector<float> from_bf16(const std::vector<__nv_bfloat16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf(x[i]);
  return y;
}

}  // namespace dz::gputest
