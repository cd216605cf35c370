#include "core/dtype.hpp"

namespace dz {

const char* to_string(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: return 2;
    case DType::F8_E4M3: case DType::U8: return 1;
    case DType::I64: return 8;
  }
  return 0;
}

}  // namespace dz
