// Norms and RoPE vs independent fp64 formulations.
#include <catch2/catch.hpp>

#include <cmath>
#include <complex>
#include <random>
#include <vector>

#include "ops/norm.hpp"
#include "ops/rope.hpp"

using namespace dz;

namespace {
std::vector<float> randv(size_t n, std::mt19937& g, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// fp64 RMSNorm of one row, optionally gated.
std::vector<double> rms64(const float* x, const float* w, int64_t D, double eps, bool zc) {
  double ss = 0;
  for (int64_t i = 0; i < D; ++i) ss += double(x[i]) * x[i];
  double inv = 1.0 / std::sqrt(ss / double(D) + eps);
  std::vector<double> y(static_cast<size_t>(D));
  for (int64_t i = 0; i < D; ++i) y[size_t(i)] = x[i] * inv * (w ? (zc ? 1.0 + w[i] : double(w[i])) : 1.0);
  return y;
}
}  // namespace

// fp32 vs fp64: the sum of squares over D <= 65 terms and a handful of multiplies give a relative
// error of a few 1e-7; 1e-5 relative (plus 1e-6 absolute near zero) leaves a wide margin yet
// catches any formula error (a missing (1 + w), eps placement, wrong mean).
TEST_CASE("norm_rope: rmsnorm matches fp64", "[unit]") {
  std::mt19937 g(11);
  for (int64_t rows : {1, 3, 7})
    for (int64_t D : {1, 3, 19, 65})
      for (int variant = 0; variant < 3; ++variant) {  // 0: no weight, 1: w, 2: zero-centred (1 + w)
        auto x = randv(size_t(rows * D), g, 2.f);
        auto w = randv(size_t(D), g, 0.5f);
        const float* wp = variant == 0 ? nullptr : w.data();
        bool zc = variant == 2;
        std::vector<float> y(x.size());
        rmsnorm(x.data(), wp, y.data(), rows, D, 1e-6f, zc);
        for (int64_t r = 0; r < rows; ++r) {
          auto ref = rms64(x.data() + r * D, wp, D, 1e-6, zc);
          for (int64_t i = 0; i < D; ++i)
            REQUIRE(std::abs(y[size_t(r * D + i)] - ref[size_t(i)]) <= 1e-5 * std::abs(ref[size_t(i)]) + 1e-6);
        }
        // In place gives the same bits.
        auto x2 = x;
        rmsnorm(x2.data(), wp, x2.data(), rows, D, 1e-6f, zc);
        REQUIRE(x2 == y);
      }
}

TEST_CASE("norm_rope: rmsnorm eps dominates tiny rows", "[unit]") {
  // x = 1e-4 everywhere, eps = 1e-2: y = 1e-4 / sqrt(1e-8 + 1e-2) (hand-computed).
  std::vector<float> x(7, 1e-4f), y(7);
  rmsnorm(x.data(), nullptr, y.data(), 1, 7, 1e-2f);
  double ref = 1e-4 / std::sqrt(1e-8 + 1e-2);
  for (float v : y) REQUIRE(std::abs(v - ref) <= 1e-6 * ref);
}

// Same tolerance argument as rmsnorm; the gate adds one exp (a few ulp).
TEST_CASE("norm_rope: gated_rmsnorm matches fp64 for SiLU and sigmoid gates", "[unit]") {
  std::mt19937 g(12);
  for (int64_t rows : {1, 5})
    for (int64_t D : {3, 19, 64})
      for (GateAct act : {GateAct::SiLU, GateAct::Sigmoid})
        for (bool zc : {false, true}) {
          auto x = randv(size_t(rows * D), g);
          auto z = randv(size_t(rows * D), g, 3.f);
          auto w = randv(size_t(D), g, 0.5f);
          std::vector<float> y(x.size());
          gated_rmsnorm(x.data(), z.data(), w.data(), y.data(), rows, D, 1e-5f, act, zc);
          for (int64_t r = 0; r < rows; ++r) {
            auto ref = rms64(x.data() + r * D, w.data(), D, 1e-5, zc);
            for (int64_t i = 0; i < D; ++i) {
              double zz = z[size_t(r * D + i)];
              double gate = act == GateAct::SiLU ? zz * sigm(zz) : sigm(zz);
              double e = ref[size_t(i)] * gate;
              REQUIRE(std::abs(y[size_t(r * D + i)] - e) <= 1e-5 * std::abs(e) + 1e-6);
            }
          }
        }
}

TEST_CASE("norm_rope: l2norm matches fp64 (eps inside the sqrt of the plain sum)", "[unit]") {
  std::mt19937 g(13);
  for (int64_t D : {1, 7, 65}) {
    auto x = randv(size_t(3 * D), g, 0.1f);
    std::vector<float> y(x.size());
    l2norm(x.data(), y.data(), 3, D, 1e-3f);  // large eps so its placement matters
    for (int64_t r = 0; r < 3; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += double(x[size_t(r * D + i)]) * x[size_t(r * D + i)];
      double inv = 1.0 / std::sqrt(ss + 1e-3);
      for (int64_t i = 0; i < D; ++i) {
        double e = x[size_t(r * D + i)] * inv;
        REQUIRE(std::abs(y[size_t(r * D + i)] - e) <= 1e-5 * std::abs(e) + 1e-7);
      }
    }
  }
}

namespace {
// fp64 inverse frequencies, written from the YaRN formula (per-dim loop, no shared code).
std::vector<double> inv_freq64(const RopeConfig& c, int64_t d) {
  std::vector<double> f(static_cast<size_t>(d / 2));
  for (int64_t i = 0; i < d / 2; ++i) f[size_t(i)] = std::pow(double(c.theta), -2.0 * double(i) / double(d));
  if (!c.yarn) return f;
  auto dim_for = [&](double rot) {
    return double(d) * std::log(double(c.yarn_original_max_pos) / (2 * M_PI * rot)) / (2 * std::log(double(c.theta)));
  };
  double lo = std::max(0.0, std::floor(dim_for(c.yarn_beta_fast)));
  double hi = std::min(double(d - 1), std::ceil(dim_for(c.yarn_beta_slow)));
  if (lo == hi) hi += 0.001;
  for (int64_t i = 0; i < d / 2; ++i) {
    double ramp = std::min(1.0, std::max(0.0, (double(i) - lo) / (hi - lo)));  // 0: keep, 1: divide by factor
    f[size_t(i)] = f[size_t(i)] * (1 - ramp) + f[size_t(i)] / c.yarn_factor * ramp;
  }
  return f;
}
double mscale64(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }

// Rope via complex multiplication in fp64: pair p = (x[a], x[b]) -> (a + ib) * mult * e^{i pos f}.
void rope64(std::vector<double>& v, const std::vector<double>& f, double mult, RopeStyle st, int64_t off,
            double pos) {
  int64_t half = int64_t(f.size());
  for (int64_t i = 0; i < half; ++i) {
    int64_t a = off + (st == RopeStyle::NeoX ? i : 2 * i), b = off + (st == RopeStyle::NeoX ? i + half : 2 * i + 1);
    std::complex<double> z(v[size_t(a)], v[size_t(b)]);
    z *= std::polar(mult, pos * f[size_t(i)]);
    v[size_t(a)] = z.real();
    v[size_t(b)] = z.imag();
  }
}
}  // namespace

// The op forms angles as fp32 pos * fp32 inv_freq (as transformers and DeepSeek do); the fp64 reference
// uses exact angles, so the angle error is about 1.2e-7 * pos * f. Tolerance per element:
// 3e-6 (cos/sin and products in fp32) + 2.5e-7 * pos * |x|_max, tight at small positions, honest at pos ~ 1e5.
TEST_CASE("norm_rope: rope (NeoX, interleaved, partial) matches fp64 complex rotation", "[unit]") {
  std::mt19937 g(14);
  for (RopeStyle st : {RopeStyle::NeoX, RopeStyle::Interleaved})
    for (int64_t pos0 : {0, 37, 100000}) {
      RopeConfig c;
      c.theta = 10000.f;
      c.style = st;
      const int64_t T = 3, H = 2, stride = 19, off = 5, rd = 8;  // rotate dims [5, 13) of a 19-wide head
      Rope rope(c, rd);
      auto x = randv(size_t(T * H * stride), g);
      auto y = x;
      rope.apply(y.data(), T, H, stride, off, pos0);
      auto f = inv_freq64(c, rd);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
          std::vector<double> v(x.begin() + (t * H + h) * stride, x.begin() + (t * H + h + 1) * stride);
          double xmax = 0;
          for (double e : v) xmax = std::max(xmax, std::abs(e));
          rope64(v, f, 1.0, st, off, double(pos0 + t));
          double tol = 3e-6 + 2.5e-7 * double(pos0 + t) * xmax;
          for (int64_t i = 0; i < stride; ++i) {
            float got = y[size_t((t * H + h) * stride + i)];
            if (i < off || i >= off + rd)
              REQUIRE(got == x[size_t((t * H + h) * stride + i)]);  // outside the span: untouched
            else
              REQUIRE(std::abs(got - v[size_t(i)]) <= tol);
          }
        }
    }
}

TEST_CASE("norm_rope: rope pos0 offset equals applying at the same absolute positions", "[unit]") {
  // Decode consistency: rotating token t of a 5-token block at pos0 = 9 equals rotating it alone at 9 + t.
  std::mt19937 g(15);
  RopeConfig c;
  c.theta = 500000.f;
  Rope rope(c, 6);
  auto x = randv(5 * 3 * 6, g);
  auto all = x;
  rope.apply(all.data(), 5, 3, 6, 0, 9);
  for (int64_t t = 0; t < 5; ++t) {
    std::vector<float> one(x.begin() + t * 18, x.begin() + (t + 1) * 18);
    rope.apply(one.data(), 1, 3, 6, 0, 9 + t);
    for (int64_t i = 0; i < 18; ++i) REQUIRE(one[size_t(i)] == all[size_t(t * 18 + i)]);
  }
}

// Recover (angle, magnitude) per frequency by rotating unit vectors at pos = 1 and compare with the fp64
// YaRN formula. fp32 inv_freq and fp32 cos/sin: relative error ~1e-7; 2e-6 relative is the bound.
TEST_CASE("norm_rope: YaRN frequencies and mscale match the fp64 formula", "[unit]") {
  struct Case { float factor, mscale, mscale_all; int64_t rd; float theta; };
  for (Case k : {Case{40.f, 1.f, 1.f, 64, 10000.f}, Case{40.f, 0.707f, 0.f, 64, 10000.f},
                 Case{8.f, 1.f, 0.5f, 38, 50000.f}, Case{1.f, 1.f, 1.f, 16, 10000.f}}) {
    RopeConfig c;
    c.theta = k.theta;
    c.yarn = true;
    c.yarn_factor = k.factor;
    c.yarn_original_max_pos = 4096;
    c.yarn_mscale = k.mscale;
    c.yarn_mscale_all_dim = k.mscale_all;
    Rope rope(c, k.rd);
    auto f = inv_freq64(c, k.rd);
    // transformers: cos/sin scaled by mscale ratio when both are set, else by get_mscale(factor).
    double mult = (k.mscale != 0 && k.mscale_all != 0) ? mscale64(k.factor, k.mscale) / mscale64(k.factor, k.mscale_all)
                                                       : mscale64(k.factor, 1.0);
    double smult = k.mscale_all != 0 ? std::pow(mscale64(k.factor, k.mscale_all), 2) : 1.0;
    REQUIRE(std::abs(rope.softmax_scale_mult() - smult) <= 1e-6 * smult);
    for (int64_t i = 0; i < k.rd / 2; ++i) {
      std::vector<float> e(size_t(k.rd), 0.f);
      e[size_t(i)] = 1.f;  // NeoX: dims i and i + rd/2 form pair i
      rope.apply(e.data(), 1, 1, k.rd, 0, 1);
      double ang = std::atan2(double(e[size_t(i + k.rd / 2)]), double(e[size_t(i)]));
      double mag = std::hypot(double(e[size_t(i + k.rd / 2)]), double(e[size_t(i)]));
      REQUIRE(std::abs(ang - f[size_t(i)]) <= 2e-6 * f[size_t(i)]);
      REQUIRE(std::abs(mag - mult) <= 2e-6 * mult);
    }
  }
  // Hand-computed corner values for DeepSeek-V3 (theta 1e4, d 64, factor 40, orig 4096): the ramp runs
  // from dim 10 to 23, so pair 5 keeps its frequency and pair 31 is divided by 40; softmax multiplier
  // (0.1 ln 40 + 1)^2 = 1.873855...
  RopeConfig c;
  c.yarn = true;
  c.yarn_factor = 40.f;
  c.yarn_mscale = 1.f;
  c.yarn_mscale_all_dim = 1.f;
  Rope rope(c, 64);
  REQUIRE(std::abs(rope.softmax_scale_mult() - 1.8738551) < 1e-6);
  for (int64_t i : {5, 31}) {
    std::vector<float> e(64, 0.f);
    e[size_t(i)] = 1.f;
    rope.apply(e.data(), 1, 1, 64, 0, 1);
    double want = std::pow(10000.0, -2.0 * double(i) / 64.0) / (i == 31 ? 40.0 : 1.0);
    REQUIRE(std::abs(std::atan2(double(e[size_t(i + 32)]), double(e[size_t(i)])) - want) <= 2e-6 * want);
  }
}

TEST_CASE("norm_rope: rope rejects spans that do not fit", "[unit]") {
  RopeConfig c;
  REQUIRE_THROWS(Rope(c, 7));
  Rope r(c, 8);
  std::vector<float> x(10);
  REQUIRE_THROWS(r.apply(x.data(), 1, 1, 10, 3, 0));
}
