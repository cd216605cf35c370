// Shared by the GPU tests that hold the CUDA backend to the CPU one (test-backend-ops style):
// bf16-exact random inputs and the normalised MSE with a finiteness check.
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/bf16.hpp"

namespace dz::gputest {

// n normal(0, scale) values rounded to bf16, so both backends see the same inputs exactly.
inline std::vector<float> rnd(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dz::round_bf16(d(g));
  return v;
}

// sum (got - ref)^2 / sum ref^2 (the plain sum when ref is all zero); every value must be finite.
inline double nmse(const std::vector<float>& got, const std::vector<float>& ref) {
  REQUIRE(got.size() == ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    REQUIRE(std::isfinite(got[i]));
    const double d = double(got[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0 ? num / den : num;
}

}  // namespace dz::gputest
