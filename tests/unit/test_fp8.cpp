// FP8 E4M3 / E8M0 / MXFP8 / per-tile FP8 / BF16 emulation (lib/core/fp8.hpp).
// Everything here is bit-exact: the checks are equalities against hand-computed values or
// against an independent brute-force formulation (nearest value in the table of all 254 finite
// e4m3 values, ties to the even code, computed in double).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8.hpp"

using namespace dz;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

// The finite non-negative e4m3 values by code 0x00..0x7E, from the format definition.
std::vector<double> e4m3_table() {
  std::vector<double> t;
  for (int c = 0; c <= 0x7E; ++c) {
    const int e = c >> 3, m = c & 7;
    t.push_back(e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7));
  }
  return t;
}

// Independent saturating RNE: nearest table entry by exhaustive search; on a tie the even code.
uint8_t ref_e4m3(double x) {
  static const std::vector<double> t = e4m3_table();
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(x);
  if (a >= 448.0) return sign | 0x7E;
  int best = 0;
  for (int c = 1; c < int(t.size()); ++c) {
    const double dc = std::fabs(t[size_t(c)] - a), db = std::fabs(t[size_t(best)] - a);
    if (dc < db || (dc == db && (c & 1) == 0)) best = c;
  }
  return uint8_t(sign | best);
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace

TEST_CASE("fp8: e4m3 decode of hand-picked codes", "[unit]") {
  CHECK(bits(e4m3_to_f32(0x00)) == bits(0.f));
  CHECK(bits(e4m3_to_f32(0x80)) == bits(-0.f));
  CHECK(e4m3_to_f32(0x01) == std::ldexp(1.f, -9));    // smallest subnormal
  CHECK(e4m3_to_f32(0x07) == 7 * std::ldexp(1.f, -9));
  CHECK(e4m3_to_f32(0x08) == std::ldexp(1.f, -6));    // smallest normal
  CHECK(e4m3_to_f32(0x38) == 1.f);
  CHECK(e4m3_to_f32(0x3C) == 1.5f);
  CHECK(e4m3_to_f32(0x40) == 2.f);
  CHECK(e4m3_to_f32(0x77) == 240.f);
  CHECK(e4m3_to_f32(0x78) == 256.f);
  CHECK(e4m3_to_f32(0x7D) == 416.f);
  CHECK(e4m3_to_f32(0x7E) == 448.f);
  CHECK(e4m3_to_f32(0xFE) == -448.f);
  CHECK(std::isnan(e4m3_to_f32(0x7F)));
  CHECK(std::isnan(e4m3_to_f32(0xFF)));
  CHECK(e4m3_is_nan(0x7F));
  CHECK(e4m3_is_nan(0xFF));
  CHECK_FALSE(e4m3_is_nan(0x7E));
}

TEST_CASE("fp8: e4m3 encode, hand-computed roundings", "[unit]") {
  // exact values
  CHECK(f32_to_e4m3(1.f) == 0x38);
  CHECK(f32_to_e4m3(-1.5f) == 0xBC);
  CHECK(f32_to_e4m3(448.f) == 0x7E);
  CHECK(f32_to_e4m3(std::ldexp(1.f, -9)) == 0x01);
  // midpoints go to the even code
  CHECK(f32_to_e4m3(1.0625f) == 0x38);  // between 1 (0x38) and 1.125 (0x39)
  CHECK(f32_to_e4m3(std::nextafter(1.0625f, 2.f)) == 0x39);
  CHECK(f32_to_e4m3(std::nextafter(1.0625f, 0.f)) == 0x38);
  CHECK(f32_to_e4m3(1.1875f) == 0x3A);  // between 1.125 (0x39) and 1.25 (0x3A)
  CHECK(f32_to_e4m3(248.f) == 0x78);    // between 240 (0x77) and 256 (0x78): binade carry
  CHECK(f32_to_e4m3(432.f) == 0x7E);    // between 416 (0x7D) and 448 (0x7E)
  CHECK(f32_to_e4m3(-432.f) == 0xFE);
  // subnormal midpoints
  CHECK(f32_to_e4m3(std::ldexp(1.f, -10)) == 0x80 - 0x80);           // 0.5 * 2^-9 -> 0 (even)
  CHECK(f32_to_e4m3(std::nextafter(std::ldexp(1.f, -10), 1.f)) == 0x01);
  CHECK(f32_to_e4m3(1.5f * std::ldexp(1.f, -9)) == 0x02);
  CHECK(f32_to_e4m3(2.5f * std::ldexp(1.f, -9)) == 0x02);
  CHECK(f32_to_e4m3(7.5f * std::ldexp(1.f, -9)) == 0x08);             // into the first normal
  // saturation (SATFINITE): 464 is the midpoint to the NaN slot 480; all of them give 448
  CHECK(f32_to_e4m3(464.f) == 0x7E);
  CHECK(f32_to_e4m3(449.f) == 0x7E);
  CHECK(f32_to_e4m3(480.f) == 0x7E);
  CHECK(f32_to_e4m3(1e6f) == 0x7E);
  CHECK(f32_to_e4m3(-1e30f) == 0xFE);
  CHECK(f32_to_e4m3(kInf) == 0x7E);
  CHECK(f32_to_e4m3(-kInf) == 0xFE);
  // zeros, tiny values, NaN
  CHECK(f32_to_e4m3(0.f) == 0x00);
  CHECK(f32_to_e4m3(-0.f) == 0x80);
  CHECK(f32_to_e4m3(1e-4f) == 0x00);    // 1e-4 * 2^9 = 0.0512 -> 0
  CHECK(f32_to_e4m3(-1e-4f) == 0x80);
  CHECK(f32_to_e4m3(1e-3f) == 0x01);    // 0.512 units of 2^-9 -> 1
  CHECK(f32_to_e4m3(1e-30f) == 0x00);
  CHECK(f32_to_e4m3(-std::numeric_limits<float>::denorm_min()) == 0x80);
  CHECK(f32_to_e4m3(kNaN) == 0x7F);
  CHECK(f32_to_e4m3(-kNaN) == 0x7F);
}

TEST_CASE("fp8: e4m3 decode -> encode is the identity on all 256 codes except NaN", "[unit]") {
  int checked = 0;
  for (int c = 0; c < 256; ++c) {
    if (e4m3_is_nan(uint8_t(c))) {
      CHECK(std::isnan(e4m3_to_f32(uint8_t(c))));
      continue;
    }
    INFO("code " << c);
    CHECK(f32_to_e4m3(e4m3_to_f32(uint8_t(c))) == c);
    // and the decoded value is the format's definition
    const double want = (c & 0x80 ? -1 : 1) * e4m3_table()[size_t(c & 0x7F)];
    CHECK(double(e4m3_to_f32(uint8_t(c))) == want);
    ++checked;
  }
  CHECK(checked == 254);
}

TEST_CASE("fp8: e4m3 encode matches a brute-force nearest search", "[unit]") {
  std::vector<float> xs;
  // every midpoint between neighbouring codes and its two f32 neighbours
  const std::vector<double> t = e4m3_table();
  for (size_t c = 0; c + 1 < t.size(); ++c) {
    const float mid = float((t[c] + t[c + 1]) / 2);  // exact in f32
    for (float v : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e9f)}) {
      xs.push_back(v);
      xs.push_back(-v);
    }
  }
  // log-uniform magnitudes from far below the subnormals to far above 448
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> ex(-14.f, 11.f);
  for (int i = 0; i < 20000; ++i) {
    const float v = std::exp2(ex(rng));
    xs.push_back(i % 2 ? -v : v);
  }
  int bad = 0;
  for (float x : xs) {
    if (f32_to_e4m3(x) != ref_e4m3(double(x))) {
      if (++bad < 5) FAIL_CHECK("x = " << x << " got " << int(f32_to_e4m3(x)) << " want " << int(ref_e4m3(x)));
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("fp8: e8m0 decode and MX scale exponents", "[unit]") {
  CHECK(e8m0_to_f32(127) == 1.f);
  CHECK(e8m0_to_f32(120) == std::ldexp(1.f, -7));
  CHECK(e8m0_to_f32(254) == std::ldexp(1.f, 127));
  CHECK(e8m0_to_f32(0) == std::ldexp(1.f, -127));  // f32 subnormal, exact
  CHECK(e8m0_to_f32(0) > 0.f);
  CHECK(std::isnan(e8m0_to_f32(0xFF)));

  using R = MxScaleRounding;
  // Ceil: smallest e with 448 * 2^e >= amax
  CHECK(mx_scale_e8m0(448.f, R::Ceil) == 127);
  CHECK(mx_scale_e8m0(std::nextafter(448.f, 1e9f), R::Ceil) == 128);
  CHECK(mx_scale_e8m0(1.f, R::Ceil) == 119);     // ceil(log2(1/448)) = ceil(-8.807) = -8
  CHECK(mx_scale_e8m0(4.f, R::Ceil) == 121);     // power-of-two amax: -6
  CHECK(mx_scale_e8m0(56.f, R::Ceil) == 124);    // 448 / 8 exactly: -3
  CHECK(mx_scale_e8m0(500.f, R::Ceil) == 128);
  // OCP v1.0: floor(log2 amax) - 8
  CHECK(mx_scale_e8m0(448.f, R::OcpFloor) == 127);
  CHECK(mx_scale_e8m0(500.f, R::OcpFloor) == 127);
  CHECK(mx_scale_e8m0(511.f, R::OcpFloor) == 127);
  CHECK(mx_scale_e8m0(512.f, R::OcpFloor) == 128);
  CHECK(mx_scale_e8m0(1.f, R::OcpFloor) == 119);
  CHECK(mx_scale_e8m0(4.f, R::OcpFloor) == 121);  // equal to Ceil for powers of two
  // special cases and clamping
  CHECK(mx_scale_e8m0(0.f) == 127);
  CHECK(mx_scale_e8m0(kInf) == 0xFF);
  CHECK(mx_scale_e8m0(kNaN) == 0xFF);
  CHECK(mx_scale_e8m0(1e-40f, R::Ceil) == 0);     // 2^-141.7: clamped to 2^-127
  CHECK(mx_scale_e8m0(std::numeric_limits<float>::max(), R::Ceil) == 127 + 120);
}

TEST_CASE("fp8: mxfp8 group with power-of-two amax, hand-computed", "[unit]") {
  std::vector<float> x(32, 0.f);
  x[0] = 4.f;      // amax = 2^2 -> scale 2^-6 (code 121) in both roundings
  x[1] = 0.1f;     // 6.4 units -> binade [4, 8), spacing 0.5 -> 6.5 -> 6.5 / 64
  x[2] = -1.f;     // 64 -> exact
  x[3] = 0.0625f;  // 4 -> exact
  x[4] = 3.3f;     // 211.2 -> binade [128, 256), spacing 16 -> 208
  x[5] = 1e-4f;    // 0.0064 = 3.28 subnormal units of 2^-9 -> 3 * 2^-9
  for (auto r : {MxScaleRounding::Ceil, MxScaleRounding::OcpFloor}) {
    std::vector<uint8_t> codes(32), scales(1);
    mxfp8_quantize(x.data(), 1, 32, codes.data(), scales.data(), r);
    CHECK(scales[0] == 121);
    CHECK(codes[0] == 0x78);  // 256
    std::vector<float> y(32);
    mxfp8_dequantize(codes.data(), scales.data(), 1, 32, y.data());
    CHECK(y[0] == 4.f);
    CHECK(y[1] == 6.5f / 64);
    CHECK(y[2] == -1.f);
    CHECK(y[3] == 0.0625f);
    CHECK(y[4] == 208.f / 64);
    CHECK(codes[5] == 0x03);
    CHECK(y[5] == 3 * std::ldexp(1.f, -15));
    for (int i = 6; i < 32; ++i) CHECK(y[size_t(i)] == 0.f);
  }
}

TEST_CASE("fp8: mxfp8 saturation differs between Ceil and OcpFloor", "[unit]") {
  std::vector<float> x(32, 1.f);
  x[7] = 500.f;
  std::vector<uint8_t> codes(32), scales(1);
  std::vector<float> y(32);
  mxfp8_quantize(x.data(), 1, 32, codes.data(), scales.data(), MxScaleRounding::OcpFloor);
  CHECK(scales[0] == 127);  // floor(log2 500) - 8 = 0
  CHECK(codes[7] == 0x7E);  // 500 saturates to 448
  mxfp8_quantize(x.data(), 1, 32, codes.data(), scales.data(), MxScaleRounding::Ceil);
  CHECK(scales[0] == 128);  // scale 2: 250 -> 256 (nearer than 240)
  mxfp8_dequantize(codes.data(), scales.data(), 1, 32, y.data());
  CHECK(y[7] == 512.f);
  CHECK(y[0] == 1.f);
}

TEST_CASE("fp8: mxfp8 zero group, tail group and non-finite group", "[unit]") {
  // n = 69: groups of 32, 32 and a tail of 5
  const int64_t n = 69;
  std::vector<float> x(static_cast<size_t>(n), 0.f);
  x[1] = -0.f;                                    // group 0: all zeros
  for (int i = 32; i < 64; ++i) x[size_t(i)] = 100.f * float(i - 40);  // group 1: amax 2300
  x[33] = kNaN;                                   // ... poisoned
  const float tail[5] = {0.75f, -0.25f, 0.f, 3.f, 1.f};  // amax 3 -> ceil(log2(3/448)) = -7
  for (int i = 0; i < 5; ++i) x[size_t(64 + i)] = tail[i];
  std::vector<uint8_t> codes(static_cast<size_t>(n)), scales(3);
  mxfp8_quantize(x.data(), 1, n, codes.data(), scales.data());
  CHECK(scales[0] == 127);
  CHECK(codes[0] == 0x00);
  CHECK(codes[1] == 0x80);
  CHECK(scales[1] == 0xFF);
  for (int i = 32; i < 64; ++i) CHECK(codes[size_t(i)] == 0x7F);
  CHECK(scales[2] == 120);
  std::vector<float> y(static_cast<size_t>(n));
  mxfp8_dequantize(codes.data(), scales.data(), 1, n, y.data());
  for (int i = 0; i < 32; ++i) CHECK(y[size_t(i)] == 0.f);
  for (int i = 32; i < 64; ++i) CHECK(std::isnan(y[size_t(i)]));
  for (int i = 0; i < 5; ++i) CHECK(y[size_t(64 + i)] == tail[i]);  // x * 128 all exact in e4m3
}

TEST_CASE("fp8: mxfp8 matches an independent formulation on random rows", "[unit]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> mag(-20.f, 20.f);
  for (int64_t n : {1, 7, 32, 33, 65, 100}) {
    for (auto r : {MxScaleRounding::Ceil, MxScaleRounding::OcpFloor}) {
      const int64_t rows = 3;
      std::vector<float> x(size_t(rows * n));
      for (int64_t row = 0; row < rows; ++row) {
        const float s = std::exp2(mag(rng));  // very different magnitudes per row
        for (int64_t j = 0; j < n; ++j) x[size_t(row * n + j)] = s * nd(rng);
      }
      const int64_t G = (n + 31) / 32;
      std::vector<uint8_t> codes(x.size()), scales(size_t(rows * G));
      mxfp8_quantize(x.data(), rows, n, codes.data(), scales.data(), r);
      std::vector<float> y(x.size()), y2(x.size());
      mxfp8_dequantize(codes.data(), scales.data(), rows, n, y.data());
      mxfp8_round(x.data(), rows, n, y2.data(), r);
      for (int64_t row = 0; row < rows; ++row)
        for (int64_t g = 0; g < G; ++g) {
          const int64_t lo = row * n + g * 32, hi = row * n + std::min(n, (g + 1) * 32);
          double amax = 0;
          for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(double(x[size_t(i)])));
          const int e = r == MxScaleRounding::Ceil ? int(std::ceil(std::log2(amax / 448.0)))
                                                   : int(std::floor(std::log2(amax))) - 8;
          INFO("n " << n << " row " << row << " group " << g);
          REQUIRE(int(scales[size_t(row * G + g)]) == e + 127);
          for (int64_t i = lo; i < hi; ++i) {
            const uint8_t want = ref_e4m3(std::ldexp(double(x[size_t(i)]), -e));
            CHECK(codes[size_t(i)] == want);
            CHECK(double(y[size_t(i)]) == double(e4m3_to_f32(want)) * std::ldexp(1.0, e));
            CHECK(bits(y2[size_t(i)]) == bits(y[size_t(i)]));
          }
        }
    }
  }
}

TEST_CASE("fp8: per-tile kv fp8, hand-computed tiles", "[unit]") {
  // n = 200: tiles of 128 and 72
  const int64_t n = 200;
  std::vector<float> x(size_t(2 * n), 0.f);
  // row 0, tile 0: amax 896 -> scale 2 exactly; elements x / 2
  x[0] = 896.f;
  x[1] = -3.f;     // -1.5 exact
  x[2] = 0.3f;     // 0.15 -> binade [0.125, 0.25), spacing 1/64 -> 0.15625 -> 0.3125
  // row 0, tile 1 (72 elements): all zero -> scale 1
  // row 1, tile 0: amax 1 -> scale fp32(1/448); 1 / scale rounds back to 448
  x[size_t(n)] = 1.f;
  x[size_t(n + 1)] = -0.5f;
  // row 1, tile 1: a NaN
  x[size_t(n + 150)] = kNaN;
  std::vector<uint8_t> codes(x.size());
  std::vector<float> scales(4);
  kv_fp8_quantize(x.data(), 2, n, codes.data(), scales.data());
  CHECK(scales[0] == 2.f);
  CHECK(scales[1] == 1.f);
  CHECK(scales[2] == 1.f / 448.f);
  CHECK(std::isnan(scales[3]));
  CHECK(codes[0] == 0x7E);
  CHECK(codes[size_t(n)] == 0x7E);
  for (int64_t j = 128; j < n; ++j) CHECK(codes[size_t(j)] == 0x00);
  for (int64_t j = n + 128; j < 2 * n; ++j) CHECK(codes[size_t(j)] == 0x7F);
  std::vector<float> y(x.size());
  kv_fp8_dequantize(codes.data(), scales.data(), 2, n, y.data());
  CHECK(y[0] == 896.f);
  CHECK(y[1] == -3.f);
  CHECK(y[2] == 0.3125f);
  CHECK(y[size_t(n)] == 448.f * (1.f / 448.f));  // one fp32 multiply
  CHECK(std::fabs(y[size_t(n)] - 1.f) < 1e-7f);
  CHECK(y[size_t(n + 1)] == -224.f * (1.f / 448.f));
  std::vector<float> z(x);
  kv_fp8_round(z.data(), 2, n, z.data());  // in place
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isnan(y[i])) CHECK(bits(z[i]) == bits(y[i]));
}

TEST_CASE("fp8: per-tile kv fp8 against an independent formulation and its error bound", "[unit]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t n : {1, 64, 127, 128, 129, 576}) {
    const int64_t rows = 4, G = (n + 127) / 128;
    std::vector<float> x(size_t(rows * n));
    for (auto& v : x) v = 3.f * nd(rng);
    std::vector<uint8_t> codes(x.size());
    std::vector<float> scales(size_t(rows * G)), y(x.size());
    kv_fp8_quantize(x.data(), rows, n, codes.data(), scales.data());
    kv_fp8_dequantize(codes.data(), scales.data(), rows, n, y.data());
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t g = 0; g < G; ++g) {
        const int64_t lo = row * n + g * 128, hi = row * n + std::min(n, (g + 1) * 128);
        float amax = 0;
        for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[size_t(i)]));
        const float s = amax / 448.f;  // the definition: one fp32 division
        INFO("n " << n << " row " << row << " tile " << g);
        REQUIRE(bits(scales[size_t(row * G + g)]) == bits(s));
        for (int64_t i = lo; i < hi; ++i) {
          CHECK(codes[size_t(i)] == ref_e4m3(double(x[size_t(i)] / s)));
          // half a spacing at the top binade (16 units of s) bounds the error; + f32 slack
          CHECK(std::fabs(y[size_t(i)] - x[size_t(i)]) <= 16.f * s * (1.f + 1e-6f));
        }
      }
  }
}

TEST_CASE("fp8: bf16 round trip, ties to even", "[unit]") {
  const float one = 1.f, u = std::ldexp(1.f, -8);  // half a bf16 ulp at 1
  std::vector<float> x = {one, one + u, one + 3 * u, one + u + std::ldexp(1.f, -20), -2.f - u, kNaN, kInf, -0.f};
  std::vector<float> y(x.size());
  bf16_round(x.data(), int64_t(x.size()), y.data());
  CHECK(y[0] == 1.f);
  CHECK(y[1] == 1.f);                       // tie -> even (1.0)
  CHECK(y[2] == one + 4 * u);               // tie between 1+2u (odd) and 1+4u (even)
  CHECK(y[3] == one + 2 * u);               // above the midpoint
  CHECK(y[4] == -2.f);                      // ulp at 2 is 4u: -2 - u is below half -> -2
  CHECK(std::isnan(y[5]));
  CHECK(y[6] == kInf);
  CHECK(bits(y[7]) == bits(-0.f));
}

// MXFP4 (E2M1 + E8M0 per 32): every nibble at a few scales decodes to the spec's value, and the
// exact re-encoding of decoded data picks the smallest scale that holds each group's largest value.
TEST_CASE("fp8: MXFP4 decode of every code, exact re-encoding", "[unit]") {
  const float mags[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  for (int n = 0; n < 16; ++n) {
    const float v = (n & 8 ? -1.f : 1.f) * mags[n & 7];
    CHECK(e2m1_to_f32(uint8_t(n)) == v);
    CHECK(std::signbit(e2m1_to_f32(uint8_t(n))) == bool(n & 8));
  }
  // one row of 32: nibbles 0..15 twice, scale 2^-3
  uint8_t packed[16], scale[1] = {124};
  for (int i = 0; i < 16; ++i) packed[i] = uint8_t((2 * i) % 16 | (((2 * i + 1) % 16) << 4));
  float y[32];
  mxfp4_dequantize(packed, scale, 1, 32, y);
  for (int j = 0; j < 32; ++j) CHECK(y[j] == e2m1_to_f32(uint8_t(j % 16)) * 0.125f);
  uint8_t p2[16], s2[1];
  REQUIRE(mxfp4_encode_exact(y, 1, 32, p2, s2));
  CHECK(s2[0] == 124);  // the largest magnitude is 6 * 2^-3: no smaller scale holds it
  for (int i = 0; i < 16; ++i) CHECK(p2[i] == packed[i]);
  // a group whose largest value is 1 * 2^-3 re-encodes with scale 2^-5 (as 4 * 2^-5): same numbers
  float z[32] = {};
  z[3] = 0.125f, z[7] = -0.0625f;
  REQUIRE(mxfp4_encode_exact(z, 1, 32, p2, s2));
  CHECK(s2[0] == 122);
  mxfp4_dequantize(p2, s2, 1, 32, y);
  for (int j = 0; j < 32; ++j) CHECK(y[j] == z[j]);
  // all zeros: the smallest scale (2^-127), codes 0; not a multiple of 32: refused
  float zero[32] = {};
  REQUIRE(mxfp4_encode_exact(zero, 1, 32, p2, s2));
  CHECK(s2[0] == 0);
  z[0] = 0.3f;  // not a code times any power of two that also holds 0.125
  CHECK(!mxfp4_encode_exact(z, 1, 32, p2, s2));
}
