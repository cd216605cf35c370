// Rotary position embedding (CPU reference).
//
// Frequencies: inv_freq[i] = theta^(-2i / rot_dim), i < rot_dim / 2.
// YaRN (transformers `_compute_yarn_parameters`, which DeepSeek-V3's inference code agrees with):
//   corr_dim(r)  = rot_dim * ln(orig_max_pos / (2π r)) / (2 ln theta)
//   low  = max(floor(corr_dim(beta_fast)), 0), high = min(ceil(corr_dim(beta_slow)), rot_dim - 1)
//   ramp[i] = clamp((i - low) / (high - low), 0, 1)        (high += 0.001 when low == high)
//   inv_freq[i] = inv_extra[i] * (1 - ramp[i]) + (inv_extra[i] / factor) * ramp[i]
//   cos/sin multiplier ("attention_factor"):
//     mscale and mscale_all_dim both non-zero: get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
//     otherwise                               : get_mscale(factor, 1)
//   softmax-scale multiplier: get_mscale(factor, mscale_all_dim)^2 when mscale_all_dim != 0, else 1,
//   with get_mscale(s, m) = s <= 1 ? 1 : 0.1 m ln s + 1.
// Angles are pos * inv_freq in fp32 (as both references compute them); cos/sin of that fp32 angle.
#include "ops/rope.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace dz {

namespace {
double yarn_get_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

double yarn_correction_dim(double num_rotations, double dim, double base, double orig_max_pos) {
  return dim * std::log(orig_max_pos / (num_rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
}
}  // namespace

Rope::Rope(const RopeConfig& cfg, int64_t rot_dim) : cfg_(cfg), rot_dim_(rot_dim) {
  DZ_CHECK(rot_dim > 0 && rot_dim % 2 == 0, "rope: rotary dim must be positive and even, got ", rot_dim);
  DZ_CHECK(cfg.theta > 1.f, "rope: theta must be > 1, got ", cfg.theta);
  const int64_t half = rot_dim / 2;
  const double base = cfg.theta, dim = double(rot_dim);
  // fp32 throughout, in the reference's operation order (theta^(2i/d) in fp32, then its fp32
  // reciprocal), so the frequencies are bit-identical to transformers' in the common case.
  std::vector<float> pf(static_cast<size_t>(half));  // theta^(2i/d)
  inv_freq_.resize(size_t(half));
  for (int64_t i = 0; i < half; ++i) {
    pf[size_t(i)] = std::pow(cfg.theta, float(2 * i) / float(rot_dim));
    inv_freq_[size_t(i)] = 1.f / pf[size_t(i)];
  }
  if (!cfg.yarn) return;

  const double factor = cfg.yarn_factor;
  DZ_CHECK(factor > 0.0, "rope: yarn factor must be positive, got ", factor);
  DZ_CHECK(cfg.yarn_original_max_pos > 0, "rope: yarn original_max_position_embeddings must be positive");
  const double beta_fast = cfg.yarn_beta_fast != 0.f ? cfg.yarn_beta_fast : 32.0;  // `or 32` in transformers
  const double beta_slow = cfg.yarn_beta_slow != 0.f ? cfg.yarn_beta_slow : 1.0;
  const double omp = double(cfg.yarn_original_max_pos);
  double low = std::floor(yarn_correction_dim(beta_fast, dim, base, omp));
  double high = std::ceil(yarn_correction_dim(beta_slow, dim, base, omp));
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  const float span = float(high - low);  // the ramp is evaluated in fp32 by the reference
  for (int64_t i = 0; i < half; ++i) {
    float ramp = (float(i) - float(low)) / span;
    ramp = std::min(std::max(ramp, 0.f), 1.f);
    const float extra = inv_freq_[size_t(i)];
    const float inter = 1.f / (float(factor) * pf[size_t(i)]);
    const float extra_w = 1.f - ramp;  // weight of the unscaled (extrapolated) frequency
    inv_freq_[size_t(i)] = inter * (1.f - extra_w) + extra * extra_w;
  }
  const double ms = cfg.yarn_mscale, ms_all = cfg.yarn_mscale_all_dim;
  cos_sin_mult_ = (ms != 0.0 && ms_all != 0.0) ? float(yarn_get_mscale(factor, ms) / yarn_get_mscale(factor, ms_all))
                                               : float(yarn_get_mscale(factor, 1.0));
  if (cfg.yarn_attention_factor >= 0.f) cos_sin_mult_ = cfg.yarn_attention_factor;  // given (DeepSeek-V4: 1)
  if (ms_all != 0.0) {
    const double m = yarn_get_mscale(factor, ms_all);
    softmax_mult_ = float(m * m);
  }
}

Rope Rope::inverse() const {
  Rope r = *this;
  for (float& f : r.inv_freq_) f = -f;  // cos(-a) = cos a, sin(-a) = -sin a
  return r;
}

Rope Rope::strided(int64_t m) const {
  DZ_CHECK(m >= 1, "rope: stride ", m);
  Rope r = *this;
  for (float& f : r.inv_freq_) f *= float(m);
  return r;
}

void Rope::apply(float* x, int64_t T, int64_t H, int64_t head_stride, int64_t offset, int64_t pos0) const {
  DZ_CHECK(offset >= 0 && offset + rot_dim_ <= head_stride, "rope: rotated span [", offset, ", ", offset + rot_dim_,
           ") does not fit a head of ", head_stride);
  const int64_t half = rot_dim_ / 2;
  std::vector<float> cs(size_t(2 * half));  // [cos(half), sin(half)] for one position
  for (int64_t t = 0; t < T; ++t) {
    const float pos = float(pos0 + t);
    for (int64_t i = 0; i < half; ++i) {
      const float ang = pos * inv_freq_[size_t(i)];
      cs[size_t(i)] = float(std::cos(double(ang))) * cos_sin_mult_;
      cs[size_t(half + i)] = float(std::sin(double(ang))) * cos_sin_mult_;
    }
    for (int64_t h = 0; h < H; ++h) {
      float* v = x + (t * H + h) * head_stride + offset;  // [rot_dim]
      for (int64_t i = 0; i < half; ++i) {
        // NeoX pairs dim i with i + half; interleaved pairs 2i with 2i + 1.
        const int64_t a = cfg_.style == RopeStyle::NeoX ? i : 2 * i;
        const int64_t b = cfg_.style == RopeStyle::NeoX ? i + half : 2 * i + 1;
        const float c = cs[size_t(i)], s = cs[size_t(half + i)];
        const float x1 = v[a], x2 = v[b];
        v[a] = x1 * c - x2 * s;
        v[b] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace dz
