// A plain owning fp32 tensor for the CPU reference backend: row-major, contiguous.
#pragma once
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

}  // namespace dz
