// A plain owning fp32 tensor for the CPU reference backend: row-major, contiguous.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace dz {

using Shape = std::vector<int64_t>;

inline int64_t numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, [](int64_t a, int64_t b) { return a * b; });
}

inline std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// A 2-D tensor may carry the block scales it was dequantised with (DeepSeek FP8 checkpoints):
// data[r][c] = e4m3 code * (*fp8_block_scales)[r / 128][c / 128] exactly as loaded, so a backend
// that keeps FP8 weights recovers the codes (fp8_block_codes in core/fp8.hpp) from the slice it
// is given. fp8_block_scales: [ceil(R / 128), ceil(C / 128)], or null for plain tensors.
constexpr int64_t kFp8WeightBlock = 128;

struct Tensor {
  Shape shape;
  std::vector<float> data;
  std::shared_ptr<const Tensor> fp8_block_scales;
  // Loaded from MXFP4 (core/fp8.hpp): every 32-element group of the last dim is E2M1 codes times
  // one power of two, so a backend that keeps MXFP4 re-encodes it exactly (mxfp4_encode_exact).
  bool mxfp4 = false;

  Tensor() = default;
  explicit Tensor(Shape s, float fill = 0.f) : shape(std::move(s)), data(size_t(numel(shape)), fill) {}

  int64_t size() const { return int64_t(data.size()); }
  int64_t dim(int i) const { return shape.at(size_t(i < 0 ? int(shape.size()) + i : i)); }
  int ndim() const { return int(shape.size()); }
  bool empty() const { return data.empty(); }
  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }
  float& operator[](int64_t i) { return data[size_t(i)]; }
  float operator[](int64_t i) const { return data[size_t(i)]; }
  // Row r of a 2-D (or the leading index of an N-D) tensor.
  float* row(int64_t r) { return data.data() + r * (size() / shape[0]); }
  const float* row(int64_t r) const { return data.data() + r * (size() / shape[0]); }

  // Compares shapes, not data, so a dry-run tensor (shape only, see Checkpoint) reshapes too.
  void reshape(Shape s) {
    DZ_CHECK(numel(s) == numel(shape), "reshape ", shape_str(shape), " -> ", shape_str(s), " changes the size");
    if (s != shape) fp8_block_scales.reset();  // the blocks are of the 2-D layout
    if (s.empty() || shape.empty() || s.back() != shape.back()) mxfp4 = false;  // groups run along the last dim
    shape = std::move(s);
  }
};

// Rows [r0, r1) of a 2-D tensor (or leading-index slab of an N-D one), copied: the TP shard of a
// loaded weight. An absent tensor (optional, no shape) stays absent; the full range is the tensor
// itself; a dry-run tensor (Checkpoint::set_dry_run: shape, no data) only changes shape.
inline Tensor slice_rows(const Tensor& t, int64_t r0, int64_t r1) {
  if (t.shape.empty() || (r0 == 0 && r1 == t.shape[0])) return t;
  DZ_CHECK(r0 >= 0 && r0 <= r1 && r1 <= t.shape[0], "slice_rows [", r0, ", ", r1, ") of ", shape_str(t.shape));
  Shape s = t.shape;
  s[0] = r1 - r0;
  if (t.empty() && numel(t.shape) > 0) {
    Tensor o;
    o.shape = s;
    return o;
  }
  Tensor o(s);
  const int64_t w = t.shape[0] ? t.size() / t.shape[0] : 0;
  std::copy(t.data.begin() + r0 * w, t.data.begin() + r1 * w, o.data.begin());
  // The block scales follow a slice that starts and ends on block rows (or the last row); any other
  // slice of an FP8 tensor is a plain fp32 tensor (a backend uploads it in its weight dtype).
  const int64_t B = kFp8WeightBlock;
  if (t.fp8_block_scales && r0 % B == 0 && (r1 % B == 0 || r1 == t.shape[0]))
    o.fp8_block_scales = std::make_shared<const Tensor>(slice_rows(*t.fp8_block_scales, r0 / B, (r1 + B - 1) / B));
  o.mxfp4 = t.mxfp4;  // whole rows: their groups are untouched
  return o;
}

// Columns [c0, c1) of a 2-D tensor, copied; absent / full-range / dry-run as slice_rows.
inline Tensor slice_cols(const Tensor& t, int64_t c0, int64_t c1) {
  if (t.shape.empty() || (t.ndim() == 2 && c0 == 0 && c1 == t.shape[1])) return t;
  DZ_CHECK(t.ndim() == 2 && c0 >= 0 && c0 <= c1 && c1 <= t.shape[1], "slice_cols [", c0, ", ", c1, ") of ",
           shape_str(t.shape));
  if (t.empty() && numel(t.shape) > 0) {
    Tensor o;
    o.shape = {t.shape[0], c1 - c0};
    return o;
  }
  Tensor o({t.shape[0], c1 - c0});
  for (int64_t r = 0; r < t.shape[0]; ++r)
    std::copy(t.data.begin() + r * t.shape[1] + c0, t.data.begin() + r * t.shape[1] + c1,
              o.data.begin() + r * (c1 - c0));
  const int64_t B = kFp8WeightBlock;  // block scales follow as in slice_rows
  if (t.fp8_block_scales && c0 % B == 0 && (c1 % B == 0 || c1 == t.shape[1]))
    o.fp8_block_scales = std::make_shared<const Tensor>(slice_cols(*t.fp8_block_scales, c0 / B, (c1 + B - 1) / B));
  o.mxfp4 = t.mxfp4 && c0 % 32 == 0 && (c1 - c0) % 32 == 0;  // whole MXFP4 groups only
  return o;
}

}  // namespace dz
