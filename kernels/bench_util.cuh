// Shared by the `dayzero bench` programs: event timing with a median over repeats, random device
// buffers, the JSON report.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
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

// The report of a `dayzero bench` program (docs/perf/): bench, commit ($DZ_COMMIT: the device
// tool's copy of a tree can carry stale git metadata, so nothing is guessed), device, date, timing
// method and the results, each one JSON object as text. Printed when `print`; written to json_out
// unless it is empty. Returns 0, or 1 with a message when json_out cannot be written.
inline int write_bench_report(const std::string& bench, const std::vector<std::string>& results,
                              const std::string& json_out, bool print) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const char* commit = std::getenv("DZ_COMMIT");
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::ostringstream os;
  os << "{\n  \"bench\": \"" << bench << "\",\n  \"commit\": \"" << (commit ? commit : "unknown")
     << "\",\n  \"device\": \"" << prop.name << " (" << prop.multiProcessorCount << " SMs)\",\n  \"date\": \"" << date
     << "\",\n  \"timing\": \"CUDA events, median of repeats after one warm-up\",\n  \"results\": [\n";
  for (size_t i = 0; i < results.size(); ++i) os << "    " << results[i] << (i + 1 < results.size() ? ",\n" : "\n");
  os << "  ]\n}\n";
  if (print) std::printf("%s", os.str().c_str());
  if (json_out.empty()) return 0;
  std::ofstream f(json_out);
  if (!(f << os.str())) {
    std::fprintf(stderr, "bench %s: cannot write %s\n", bench.c_str(), json_out.c_str());
    return 1;
  }
  return 0;
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
