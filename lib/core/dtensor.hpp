// A typed, device-tagged tensor view (DESIGN §10): what the model's layer stack and modules pass to
// the backend's ops. Row-major and contiguous; `mem` owns (shares) the allocation, so copies are
// cheap views and a slice keeps its parent alive. Host fp32 `Tensor` (core/tensor.hpp) stays for
// loading, I/O and tests; a backend uploads weights from it once (Backend::upload).
#pragma once
#include <cstdint>
#include <memory>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"

namespace dz {

enum class Device : uint8_t { Host, Cuda };
inline const char* to_string(Device d) { return d == Device::Host ? "host" : "cuda"; }

struct DTensor {
  std::shared_ptr<void> mem;  // owner of the allocation (nullptr: a borrowed view)
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::Host;
  Shape shape;
  // FP8 block-scaled weights (dtype F8_E4M3, [N, K]): the fp32 scales, one per 128 x 128 block,
  // in the layout of the backend that made them (Backend::weight); null otherwise.
  std::shared_ptr<const DTensor> block_scales;
  // MXFP4 weights (dtype U8 [.., N, K/2]: E2M1 pairs, the even k in the low nibble; core/fp8.hpp):
  // their E8M0 scales [.., N, K/32] (U8), in the layout of the backend that made them; null otherwise.
  std::shared_ptr<const DTensor> mx_scales;

  bool defined() const { return data != nullptr || (!shape.empty() && numel() == 0); }
  int64_t numel() const { return shape.empty() ? 0 : dz::numel(shape); }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(size_t(i < 0 ? int(shape.size()) + i : i)); }
  int ndim() const { return int(shape.size()); }
  // As a matrix: cols = last dim, rows = everything before it.
  int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  int64_t rows() const {
    int64_t r = shape.empty() ? 0 : 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) r *= shape[i];
    return r;
  }

  template <class T>
  T* ptr() const {
    DZ_CHECK(!defined() || sizeof(T) == dtype_size(dtype), "DTensor of ", to_string(dtype), " read as a ",
             sizeof(T), "-byte type");
    return static_cast<T*>(data);
  }
  // Host fp32 access (the CPU backend's tensors): checked.
  float* f32() const {
    DZ_CHECK(dtype == DType::F32 && device == Device::Host, "expected a host F32 tensor, got ", to_string(device), " ",
             to_string(dtype), " ", shape_str(shape));
    return static_cast<float*>(data);
  }
  int32_t* i32() const {
    DZ_CHECK(dtype == DType::I32 && device == Device::Host, "expected a host I32 tensor, got ", to_string(device), " ",
             to_string(dtype));
    return static_cast<int32_t*>(data);
  }

  // Leading-index slab [r0, r1) (rows of a matrix, or of the first dim): a view.
  DTensor slab(int64_t r0, int64_t r1) const {
    DZ_CHECK(!shape.empty() && r0 >= 0 && r0 <= r1 && r1 <= shape[0], "slab [", r0, ", ", r1, ") of ",
             shape_str(shape));
    DTensor v = *this;
    const int64_t per = shape[0] ? numel() / shape[0] : 0;
    v.data = static_cast<char*>(data) + size_t(r0 * per) * dtype_size(dtype);
    v.shape[0] = r1 - r0;
    return v;
  }
  DTensor reshaped(Shape s) const {
    DZ_CHECK(dz::numel(s) == numel(), "reshape ", shape_str(shape), " -> ", shape_str(s), " changes the size");
    DTensor v = *this;
    v.shape = std::move(s);
    return v;
  }
};

// A host F32 view of a Tensor's data (no copy; the Tensor must outlive it).
inline DTensor host_view(const Tensor& t) {
  DTensor v;
  v.data = const_cast<float*>(t.ptr());
  v.shape = t.shape;
  return v;
}
inline DTensor host_view(float* p, Shape s) {
  DTensor v;
  v.data = p;
  v.shape = std::move(s);
  return v;
}
inline DTensor host_view(int32_t* p, Shape s) {
  DTensor v;
  v.data = p;
  v.dtype = DType::I32;
  v.shape = std::move(s);
  return v;
}

}  // namespace dz
