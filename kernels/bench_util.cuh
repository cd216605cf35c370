// Shared by the `dayzero bench` programs: event timing with a median over repeats.
#pragma once
#include <algorithm>
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

}  // namespace dz::cuda
