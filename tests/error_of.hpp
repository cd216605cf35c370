// The message of the dz::Error that f throws, or "<no error>": the loader and config tests match
// on the text users read (a name, a shape, the file), not only on a throw.
#pragma once
#include <functional>
#include <string>

#include "core/error.hpp"

namespace dz::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dz::Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace dz::test
