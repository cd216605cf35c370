// Element types: of checkpoint tensors (safetensors dtypes) and of backend tensors (core/dtensor.hpp).
#pragma once
#include <cstddef>
#include <cstdint>

namespace dz {

enum class DType : uint8_t { F32, BF16, F16, F8_E4M3, I32, I64, U8 };
const char* to_string(DType d);
size_t dtype_size(DType d);

}  // namespace dz
