// Shared by the `dayzero bench` programs: event timing with a median over repeats, random device
// buffers.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "common.cuh"

namespace dz::cuda {

// Median (ms) of `reps` event-timed calls of fn after `warm` untimed ones (synchronised, so the
// warm-up's module loading and allocations stay out of the numbers).
inline double median_ms(const std::function<void()>& fn, int reps, int warm = 1) {
  for (int i = 0; i < warm; ++i) fn();
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a));
    fn();
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Deterministic pseudo-random device buffers (uniform in [lo, hi), a hash of the index and seed):
// no host traffic for GBs of bench inputs. Internal linkage: each bench program gets its own copy.
namespace benchrand {
namespace {
__global__ void fill_bf16(__nv_bfloat16* x, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 16, h *= 0x85ebca6bu, h ^= h >> 13, h *= 0xc2b2ae35u, h ^= h >> 16;
    x[i] = __float2bfloat16(lo + (hi - lo) * (h >> 8) * (1.f / 16777216.f));
  }
}
__global__ void fill_f32(float* x, size_t n, uint32_t seed, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 16, h *= 0x85ebca6bu, h ^= h >> 13, h *= 0xc2b2ae35u, h ^= h >> 16;
    x[i] = lo + (hi - lo) * (h >> 8) * (1.f / 16777216.f);
  }
}

template <class T>
T* alloc(size_t n) {
  T* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}
__nv_bfloat16* rand_bf16(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  __nv_bfloat16* p = alloc<__nv_bfloat16>(n);
  fill_bf16<<<1024, 256>>>(p, n, seed, lo, hi);
  CUDA_CHECK_LAUNCH();
  return p;
}
float* rand_f32(size_t n, uint32_t seed, float lo, float hi) {
  float* p = alloc<float>(n);
  fill_f32<<<1024, 256>>>(p, n, seed, lo, hi);
  CUDA_CHECK_LAUNCH();
  return p;
}
}  // namespace
}  // namespace benchrand

}  // namespace dz::cuda
