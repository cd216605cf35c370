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

// --dummy-weights of MXFP4 weights (Kimi K3's routed experts): the 32 dummy values of group g
// (elements base .. base + 31 of the virtual tensor) rounded to MXFP4 as OCP MX does: the E8M0
// scale 2^(floor(log2 amax) - 2) (code 0, 2^-127, for an all-zero group), each element the nearest
// E2M1 code of v / scale (ties to the smaller magnitude; |v| / scale < 8, so 6 is the largest).
// codes[32]: nibbles (sign in bit 3). Exact float steps only: the host and the GPU agree bit for bit.
DZ_HD void dummy_mx4_group(uint64_t key, uint64_t base, DummyDist d, uint8_t* codes, uint8_t* scale) {
  float v[32];
  float amax = 0.f;
  for (int j = 0; j < 32; ++j) {
    v[j] = dummy_value(key, base + uint64_t(j), d);
    const float a = v[j] < 0.f ? -v[j] : v[j];
    amax = a > amax ? a : amax;
  }
  uint32_t bits;
  __builtin_memcpy(&bits, &amax, 4);
  const int ex = int((bits >> 23) & 0xFFu);  // biased exponent: floor(log2 amax) + 127 for a normal amax
  if (amax == 0.f || ex < 3) {  // all zero (or amax below 2^-124: never from these values): zeros
    for (int j = 0; j < 32; ++j) codes[j] = 0;
    *scale = 0;
    return;
  }
  *scale = uint8_t(ex - 2);  // 2^(floor(log2 amax) - 2)
  uint32_t ib = uint32_t(127 + 127 - (ex - 2)) << 23;  // 2^-(e) with e = ex - 2 - 127: exact
  float inv;
  __builtin_memcpy(&inv, &ib, 4);
  for (int j = 0; j < 32; ++j) {
    const float q = (v[j] < 0.f ? -v[j] : v[j]) * inv;  // exact: a power-of-two scaling
    const uint8_t m = q <= 0.25f ? 0 : q <= 0.75f ? 1 : q <= 1.25f ? 2 : q <= 1.75f ? 3 : q <= 2.5f ? 4 : q <= 3.5f ? 5 : q <= 5.f ? 6 : 7;
    codes[j] = uint8_t(m | (v[j] < 0.f ? 8u : 0u));
  }
}

}  // namespace dz
