// Shared by every CUDA kernel file: error checking that names the call, and bf16 helpers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/error.hpp"

#define CUDA_CHECK(call)                                                                      \
  do {                                                                                        \
    cudaError_t _e = (call);                                                                  \
    if (_e != cudaSuccess)                                                                    \
      ::dz::fail(::dz::str(#call, " failed: ", cudaGetErrorString(_e), " (", __FILE__, ":", __LINE__, ")")); \
  } while (0)

// After a launch: configuration errors surface here, execution errors at the next sync.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

namespace dz::cuda {
// 16-byte aligned (what vector loads and TMA need).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
// Multiprocessors of the current device, asked each time (a cheap driver query; no cached
// global, so a process that switches devices gets the right count).
inline int sm_count() {
  int dev = 0, n = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}
}  // namespace dz::cuda
