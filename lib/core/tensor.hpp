// A plain owning fp32 tensor for the CPU reference backend: row-major, contiguous.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
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

struct Tensor {
  Shape shape;
  std::vector<float> data;

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
  return o;
}

}  // namespace dz
