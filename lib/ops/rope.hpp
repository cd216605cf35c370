// Rotary position embedding (CPU reference): NeoX (rotate halves) and interleaved (adjacent
// pairs) styles, partial rotary, and YaRN frequency scaling as DeepSeek-V3 uses it.
#pragma once
#include <cstdint>
#include <vector>

#include "config/model_config.hpp"

namespace dz {

class Rope {
 public:
  // rot_dim: number of rotated dims per head (even).
  Rope(const RopeConfig& cfg, int64_t rot_dim);
  // Rotate, in place, dims [offset, offset + rot_dim) of every head of x[T, H, head_stride] for
  // absolute positions pos0 .. pos0 + T - 1.
  void apply(float* x, int64_t T, int64_t H, int64_t head_stride, int64_t offset, int64_t pos0) const;
  // Multiplier on the softmax scale (YaRN mscale^2 when mscale_all_dim is set; else 1).
  float softmax_scale_mult() const { return softmax_mult_; }
  int64_t rot_dim() const { return rot_dim_; }
  // What a device implementation needs: the frequencies, the cos/sin multiplier, the pairing.
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  float cos_sin_mult() const { return cos_sin_mult_; }
  bool interleaved() const { return cfg_.style == RopeStyle::Interleaved; }
  // The rotation by -angle (inverse(): DeepSeek-V4 un-rotates its attention output at the query
  // position), and the one whose position p stands for absolute position p · m (strided(m): the
  // compressed entry of window p, which sits at p · m).
  Rope inverse() const;
  Rope strided(int64_t m) const;

 private:
  RopeConfig cfg_;
  int64_t rot_dim_;
  std::vector<float> inv_freq_;  // [rot_dim / 2]
  float cos_sin_mult_ = 1.f;     // YaRN attention factor applied to cos/sin
  float softmax_mult_ = 1.f;
};

}  // namespace dz
