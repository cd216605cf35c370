// The envelope of every `dayzero bench` JSON report (docs/perf/): the commit ($DZ_COMMIT), the
// date (UTC), the device and the backend; each bench adds its method, weights and results.
#pragma once
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/backend.hpp"
#include "core/error.hpp"

namespace dz {

inline nlohmann::json bench_envelope(const Backend& be, const std::string& backend) {
  nlohmann::json j;
  const char* commit = std::getenv("DZ_COMMIT");
  j["commit"] = commit ? commit : "unknown";
  const std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  j["date"] = date;
  j["device"] = be.describe();
  j["backend"] = backend;
  return j;
}

inline void write_bench_report(const std::string& path, const nlohmann::json& j) {
  std::ofstream f(path);
  DZ_CHECK(f.good(), "cannot write ", path);
  f << j.dump(1) << "\n";
  DZ_CHECK(f.good(), "cannot write ", path);
}

}  // namespace dz
