// Rank-prefixed logging to stderr. The rank is set once by the runtime (dist/).
#pragma once
#include <cstdio>
#include <string>

namespace dz {

struct LogState {
  int rank = 0;
  int world = 1;
  bool verbose = false;
};
LogState& log_state();

// "[dayzero r3] message"
void log_info(const std::string& msg);
// Printed by rank 0 only.
void log_root(const std::string& msg);
void log_debug(const std::string& msg);

}  // namespace dz
