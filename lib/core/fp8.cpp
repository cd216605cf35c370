// FP8 E4M3 / E8M0 / MXFP8 / per-tile FP8 / BF16 emulation; the rules are in fp8.hpp.
#include "core/fp8.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/bf16.hpp"
#include "core/error.hpp"

namespace dz {

uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7Fu;
  const uint8_t sign = std::signbit(x) ? 0x80u : 0x00u;
  const float a = std::fabs(x);
  if (a > kE4m3Max) return uint8_t(sign | 0x7Eu);  // saturate (covers ±Inf)
  if (a == 0.f) return sign;
  int E;
  std::frexp(a, &E);             // a = f * 2^E, f in [0.5, 1): floor(log2 a) = E - 1
  int e = std::max(E - 1, -6);   // binade; below 2^-6 the subnormal spacing 2^-9 applies
  const float q = std::ldexp(a, 3 - e);  // a in units of the spacing 2^(e-3): exact, q < 16
  uint32_t i = uint32_t(q);
  const float frac = q - float(i);       // exact
  if (frac > 0.5f || (frac == 0.5f && (i & 1u))) ++i;  // ties to even
  if (i == 0) return sign;
  if (e == -6 && i < 8) return uint8_t(sign | i);  // subnormal: i * 2^-9
  if (i == 16) {  // rounded up into the next binade
    i = 8;
    ++e;
  }
  // normal: (i / 8) * 2^e with i in [8, 15]; a <= 448 keeps the code <= 0x7E
  return uint8_t(sign | uint32_t((e + 7) << 3) | (i - 8u));
}

float e4m3_to_f32(uint8_t c) {
  const int ex = (c >> 3) & 0xF;
  const int man = c & 0x7;
  if (ex == 15 && man == 7) return std::numeric_limits<float>::quiet_NaN();
  const float v = ex == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), ex - 10);
  return (c & 0x80u) ? -v : v;
}

float e8m0_to_f32(uint8_t c) {
  if (c == 0xFFu) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.f, int(c) - 127);
}

uint8_t mx_scale_e8m0(float amax, MxScaleRounding r) {
  if (!std::isfinite(amax)) return 0xFFu;
  DZ_CHECK(amax >= 0.f, "mx_scale_e8m0: amax ", amax, " is negative");
  if (amax == 0.f) return 127u;
  const double A = amax;  // exact; 448 * 2^e is exact in double as well
  int E;
  std::frexp(A, &E);
  const int fl = E - 1;  // floor(log2 amax)
  int e;
  if (r == MxScaleRounding::OcpFloor) {
    e = fl - 8;  // emax of E4M3
  } else {
    // smallest e with 448 * 2^e >= amax; 448 * 2^(fl-9) < 2^fl <= amax, so start there
    e = fl - 9;
    while (std::ldexp(448.0, e) < A) ++e;
  }
  e = std::min(std::max(e, -127), 127);
  return uint8_t(e + 127);
}

namespace {

// amax over x[0..m); false when a NaN or ±Inf is present.
bool finite_amax(const float* x, int64_t m, float& amax) {
  amax = 0.f;
  for (int64_t i = 0; i < m; ++i) {
    if (!std::isfinite(x[i])) return false;
    amax = std::max(amax, std::fabs(x[i]));
  }
  return true;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_shape(const char* what, int64_t rows, int64_t n) {
  DZ_CHECK(rows >= 0 && n >= 0, what, ": negative shape [", rows, ", ", n, "]");
}

}  // namespace

void mxfp8_quantize(const float* x, int64_t rows, int64_t n, uint8_t* codes, uint8_t* scales, MxScaleRounding r) {
  check_shape("mxfp8_quantize", rows, n);
  const int64_t G = ceil_div(n, kMxGroup);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t o = row * n + g * kMxGroup;
      const int64_t m = std::min(kMxGroup, n - g * kMxGroup);  // a tail group is shorter
      uint8_t& s = scales[row * G + g];
      float amax;
      if (!finite_amax(x + o, m, amax)) {
        s = 0xFFu;
        std::fill(codes + o, codes + o + m, uint8_t(0x7Fu));
        continue;
      }
      s = mx_scale_e8m0(amax, r);
      const int e = int(s) - 127;
      // x * 2^-e is exact (both directions stay inside f32 for finite amax), as the GPU's
      // multiply by the reciprocal power of two is.
      for (int64_t i = 0; i < m; ++i) codes[o + i] = f32_to_e4m3(std::ldexp(x[o + i], -e));
    }
  }
}

void mxfp8_dequantize(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t n, float* y) {
  check_shape("mxfp8_dequantize", rows, n);
  const int64_t G = ceil_div(n, kMxGroup);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t j = 0; j < n; ++j)
      y[row * n + j] = e4m3_to_f32(codes[row * n + j]) * e8m0_to_f32(scales[row * G + j / kMxGroup]);
}

void mxfp8_round(const float* x, int64_t rows, int64_t n, float* y, MxScaleRounding r) {
  check_shape("mxfp8_round", rows, n);
  std::vector<uint8_t> codes(static_cast<size_t>(n)), scales(static_cast<size_t>(ceil_div(n, kMxGroup)));
  for (int64_t row = 0; row < rows; ++row) {
    mxfp8_quantize(x + row * n, 1, n, codes.data(), scales.data(), r);
    mxfp8_dequantize(codes.data(), scales.data(), 1, n, y + row * n);
  }
}

void kv_fp8_quantize(const float* x, int64_t rows, int64_t n, uint8_t* codes, float* scales) {
  check_shape("kv_fp8_quantize", rows, n);
  const int64_t G = ceil_div(n, kKvTile);
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t o = row * n + g * kKvTile;
      const int64_t m = std::min(kKvTile, n - g * kKvTile);
      float& s = scales[row * G + g];
      float amax;
      if (!finite_amax(x + o, m, amax)) {
        s = std::numeric_limits<float>::quiet_NaN();
        std::fill(codes + o, codes + o + m, uint8_t(0x7Fu));
        continue;
      }
      s = amax / kE4m3Max;
      if (s == 0.f) s = 1.f;  // all zeros (or amax < ~6e-43): unit scale, zero elements
      for (int64_t i = 0; i < m; ++i) codes[o + i] = f32_to_e4m3(x[o + i] / s);
    }
  }
}

void fp8_block_codes(const float* w, int64_t R, int64_t C, const float* scales, uint8_t* codes) {
  check_shape("fp8_block_codes", R, C);
  const int64_t G = ceil_div(C, kKvTile);  // 128-column blocks
  for (int64_t r = 0; r < R; ++r) {
    const float* srow = scales + (r / kKvTile) * G;
    for (int64_t c = 0; c < C; ++c) {
      const float s = srow[c / kKvTile];
      codes[r * C + c] = s == 0.f ? uint8_t(0) : f32_to_e4m3(w[r * C + c] / s);
    }
  }
}

void kv_fp8_dequantize(const uint8_t* codes, const float* scales, int64_t rows, int64_t n, float* y) {
  check_shape("kv_fp8_dequantize", rows, n);
  const int64_t G = ceil_div(n, kKvTile);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t j = 0; j < n; ++j) y[row * n + j] = e4m3_to_f32(codes[row * n + j]) * scales[row * G + j / kKvTile];
}

void kv_fp8_round(const float* x, int64_t rows, int64_t n, float* y) {
  check_shape("kv_fp8_round", rows, n);
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  std::vector<float> scales(static_cast<size_t>(ceil_div(n, kKvTile)));
  for (int64_t row = 0; row < rows; ++row) {
    kv_fp8_quantize(x + row * n, 1, n, codes.data(), scales.data());
    kv_fp8_dequantize(codes.data(), scales.data(), 1, n, y + row * n);
  }
}

void bf16_round(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = round_bf16(x[i]);
}

float e2m1_to_f32(uint8_t nibble) {
  static const float kE2m1[16] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};
  return kE2m1[nibble & 0xFu];
}

void mxfp4_dequantize(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t n, float* y) {
  check_shape("mxfp4_dequantize", rows, n);
  DZ_CHECK(n % kMx4Group == 0, "mxfp4_dequantize: row length ", n, " is not a multiple of ", kMx4Group);
  const int64_t G = n / kMx4Group;
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t b = packed[row * (n / 2) + j / 2];
      y[row * n + j] = e2m1_to_f32(j % 2 ? uint8_t(b >> 4) : b) * e8m0_to_f32(scales[row * G + j / kMx4Group]);
    }
}

namespace {
// The E2M1 code of v (|v| one of the eight magnitudes, sign kept), or 0xFF when v is not one.
uint8_t e2m1_code(float v) {
  for (uint8_t c = 0; c < 8; ++c) {
    const float m = e2m1_to_f32(c);
    if (v == m && !std::signbit(v)) return c;
    if (v == -m && (m != 0.f || std::signbit(v))) return uint8_t(c | 8u);
  }
  return 0xFFu;
}
}  // namespace

bool mxfp4_encode_exact(const float* x, int64_t rows, int64_t n, uint8_t* packed, uint8_t* scales) {
  check_shape("mxfp4_encode_exact", rows, n);
  DZ_CHECK(n % kMx4Group == 0, "mxfp4_encode_exact: row length ", n, " is not a multiple of ", kMx4Group);
  const int64_t G = n / kMx4Group;
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t g = 0; g < G; ++g) {
      const float* v = x + row * n + g * kMx4Group;
      float amax = 0.f;
      for (int64_t j = 0; j < kMx4Group; ++j) {
        if (!std::isfinite(v[j])) return false;
        amax = std::max(amax, std::fabs(v[j]));
      }
      // smallest e in [-127, 127] with 6 * 2^e >= amax (all-zero groups: 2^-127)
      int e = -127;
      while (e < 127 && 6.f * std::ldexp(1.f, e) < amax) ++e;
      scales[row * G + g] = uint8_t(e + 127);
      const float inv = std::ldexp(1.f, -e);
      for (int64_t j = 0; j < kMx4Group; ++j) {
        // v * 2^-e is exact when v is a code times 2^e (only the exponent changes; subnormal v
        // are multiples of 2^-149, and so are the products, which then have room to be exact)
        const float q = v[j] * inv;
        const uint8_t c = e2m1_code(q);
        if (c == 0xFFu || std::ldexp(e2m1_to_f32(c), e) != v[j]) return false;
        uint8_t& b = packed[row * (n / 2) + (g * kMx4Group + j) / 2];
        if (j % 2 == 0)
          b = c;
        else
          b = uint8_t(b | (c << 4));
      }
    }
  return true;
}

}  // namespace dz
