// bf16 / f16 <-> f32 conversions (bit-exact, round-to-nearest-even on narrowing, NaN preserved).
// Used by the checkpoint reader/writer and by the CPU emulation of the CUDA backend's storage.
#pragma once
#include <cstdint>
#include <cstring>

namespace dz {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bf16 is the top half of an f32: widening is exact.
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

// Round to nearest, ties to even. NaN stays NaN (quiet bit forced so truncation cannot make Inf).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // overflow into the exponent rounds up to the next binade / Inf, as IEEE does
  return uint16_t(u >> 16);
}

// Round an f32 to the nearest bf16 value, returned as f32.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13));  // Inf / NaN
  if (exp == 0) {
    // zero or subnormal: man * 2^-24, exact in f32
    float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));  // 112 = 127 - 15
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN, quiet
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to Inf (incl. Inf)
  if (a < 0x38800000u) {
    // below the smallest normal 2^-14: subnormal result man * 2^-24, RNE on the shifted mantissa
    if (a < 0x33000000u) return sign;  // < 2^-25: rounds to zero (2^-25 exactly ties to even 0)
    uint32_t e = a >> 23;               // 102..112
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;          // value = m * 2^(e-150); result unit 2^-24
    uint32_t r = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  // normal: rebias exponent, RNE on the 13 dropped bits (carry into exponent is correct)
  uint32_t lsb = (a >> 13) & 1u;
  a += 0xfffu + lsb;
  return uint16_t(sign | (((a >> 13) - (112u << 10)) & 0x7fffu));
}

}  // namespace dz
