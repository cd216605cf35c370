// --dummy-weights values, one definition for the host (Checkpoint::dummy) and the GPU
// (Backend::fill_dummy): element i of a tensor with key k = splitmix64(seed) ^ fnv1a64(name) is a
// function of (k, i) alone, so a TP slice generated in place on the device equals the same slice of
// the whole tensor generated on the host, bit for bit (the float steps below are exact or single
// IEEE operations, with no contraction into FMA possible).
#pragma once
#include <cstdint>

#include "core/hash.hpp"  // splitmix64, DZ_HD

namespace dz {

// Normal(0, a) approximated by the sum of four 16-bit uniforms (Irwin-Hall, scaled to unit
// variance, bounded at +-3.46 sigma), or Uniform[a, b) from 24 bits.
struct DummyDist {
  bool uniform = false;
  float a = 0.02f, b = 0.f;
};

DZ_HD float dummy_value(uint64_t key, uint64_t i, DummyDist d) {
  const uint64_t h = splitmix64(key + i * 0x9e3779b97f4a7c15ull);
  if (d.uniform) {
    const float u = float(h >> 40) * (1.f / 16777216.f);  // exact: 24 bits times a power of two
    return d.a + (d.b - d.a) * u;
  }
  const float s = float(h & 0xffff) + float((h >> 16) & 0xffff) + float((h >> 32) & 0xffff) + float(h >> 48);
  const float c = s - 131070.f;           // exact (integers below 2^24); mean 2 * 65535
  return (d.a * c) * (1.7320508f / 65536.f);  // unit variance: 4 * (65536^2 - 1) / 12
}

}  // namespace dz
