// Small portable hashes with fixed results on every platform (and in CUDA code): splitmix64 for
// seeds and counters (generated weights, sampling), FNV-1a 64 for names and fingerprints.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#if defined(__CUDACC__)
#define DZ_HD __host__ __device__ __forceinline__
#else
#define DZ_HD inline
#endif

namespace dz {

DZ_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}
inline uint64_t fnv1a64(const std::string& s) { return fnv1a64(s.data(), s.size()); }

}  // namespace dz
