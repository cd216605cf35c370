#include "core/log.hpp"

namespace dz {

LogState& log_state() {
  static LogState s;  // set once at start-up by the runtime; read-only afterwards
  return s;
}

void log_info(const std::string& msg) {
  std::fprintf(stderr, "[dayzero r%d] %s\n", log_state().rank, msg.c_str());
  std::fflush(stderr);
}

void log_root(const std::string& msg) {
  if (log_state().rank == 0) {
    std::fprintf(stderr, "[dayzero] %s\n", msg.c_str());
    std::fflush(stderr);
  }
}

void log_debug(const std::string& msg) {
  if (log_state().verbose) log_info(msg);
}

}  // namespace dz
