// libFuzzer harness: the config.json normaliser (dz::ModelConfig::from_json, lib/config/).
// Input: the bytes of a config.json. Not JSON -> ignored; otherwise from_json must either return
// a ModelConfig (then to_json() and validate() run on it) or throw a std::exception (a dz::Error
// naming the field). Crashes, hangs and sanitizer reports are the findings.
#include <cstddef>
#include <cstdint>
#include <exception>

#include <nlohmann/json.hpp>

#include "config/model_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const dz::ModelConfig c = dz::ModelConfig::from_json(j);
    const std::string s = c.to_json().dump();
    if (s.empty()) __builtin_trap();
    c.validate();  // from_json already validated: it must not throw now
  } catch (const std::exception&) {
  }
  return 0;
}
